"""An OpenAI-compatible chat server for a mocojax checkpoint (docs/serving.md):

  python -m mocojax.serve --model HF_DIR_OR_WORKDIR[@STAGE] [--port 8000] [--host 127.0.0.1]

POST /v1/chat/completions takes the protocol vLLM, SGLang and hosted APIs speak (messages whose
content is a string or a list of {"type": "text"} and {"type": "image_url"} items with base64
`data:` URLs; temperature, top_p, max_tokens, n, seed, logprobs) and answers with a
chat.completion object. GET /v1/models lists the one model; GET /health answers {"status": "ok"}.

Requests are batched: a worker thread takes the first waiting request, collects those that
arrive within --batch_window_ms (up to --max_batch prompts), groups them by sampling settings
and runs one jitted `sampling.generate` call per group (its rows padded to a power of two and
its max_tokens rounded up to one, so few programs are compiled). Greedy requests (temperature 0) batch
with any other greedy request; sampled requests with a `seed` run alone (so a seed always gives
the same reply, whatever else is in flight); unseeded sampled requests share one call.

The HTTP stack is Starlette (ASGI routing, requests, JSON responses) served by uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import base64  # noqa: F401 - parse_request moved out; tests/test_serve.py reads serve.base64
import dataclasses
import json
import os
import queue
import threading
import time
import uuid

import jax
import numpy as np

from mocojax import processing, sampling

# Split out (move only, #14); re-exported so `serve.<name>` keeps working.
from mocojax.serve_requests import (  # noqa: F401
    _UNSUPPORTED,
    Request,
    RequestError,
    _content,
    _image,
    _number,
    parse_request,
)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclasses.dataclass
class Model:
    name: str
    cfg: object
    params: object
    processor: processing.Processor


def load_model(spec, *, min_pixels=None, max_pixels=None, dtype="float32", name=None):
    """Returns the Model of an HF directory or a workdir[@stage] (its rl checkpoint, else sft)."""
    from mocojax import hf
    from mocojax.eval import suite

    source = suite.resolve(spec)
    if source["kind"] == "hf":
        cfg, params = hf.load_pretrained(source["path"], dtype=dtype)
        processor = processing.Processor(
            processing.load_tokenizer(source["path"]), min_pixels=min_pixels, max_pixels=max_pixels
        )
    elif source["kind"] == "workdir":
        import ml_collections

        from mocojax import checkpoint, config_utils

        config_file = os.path.join(source["path"], "config.json")
        if not os.path.isfile(config_file):
            raise suite.SpecError(
                f"{spec}: the workdir has no config.json (written by mocojax.main)"
            )
        with open(config_file) as f:
            config = ml_collections.ConfigDict(json.load(f))
        setup = config_utils.build_setup(config, source["path"])
        cfg = setup.model_config
        params, _ = checkpoint.restore_params(source["path"], source["stage"], cfg)
        processor = setup.processor
    else:
        raise suite.SpecError(f"{spec}: serve wants an HF directory or a workdir with checkpoints")
    return Model(name or source["label"], cfg, params, processor)


# ----------------------------------------------------------------------------------------------
# Batched generation
# ----------------------------------------------------------------------------------------------


def _bucket(n, limit):
    """Rounds max_new_tokens up to a power of two >= 16 (at most limit): few compiled decode programs."""
    return min(max(16, 1 << (int(n) - 1).bit_length()), limit)


class Batcher:
    """A worker thread that runs queued Requests through `sampling.generate` in batches."""

    def __init__(self, model, *, window_s=0.01, max_batch=16, max_tokens_limit=1024, seed=0):
        self.model, self.window_s, self.max_batch, self.max_tokens_limit = (
            model,
            window_s,
            max_batch,
            max_tokens_limit,
        )
        self._queue, self._rng, self._calls = queue.Queue(), jax.random.key(seed), 0
        self.batch_sizes = []  # prompts per sampler call, in order (for tests and logs)
        self._thread = threading.Thread(
            target=self._loop, name="mocojax-serve-batcher", daemon=True
        )
        self._thread.start()

    def submit(self, request):
        self._queue.put(request)
        return request.future

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self):
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending, deadline = [first], time.monotonic() + self.window_s
            while len(pending) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                pending.append(item)
            groups = {}
            for request in pending:
                groups.setdefault(request.group_key(), []).append(request)
            for group in groups.values():
                self._run_group(group)

    def _run_group(self, group):
        try:
            results = self.generate(group)
        except Exception as error:  # noqa: BLE001 - one bad prompt must not fail the others: run each alone
            if len(group) == 1:
                group[0].future.set_exception(
                    RequestError(str(error))
                    if isinstance(error, (ValueError, TypeError))
                    else error
                )
                return
            for request in group:
                self._run_group([request])
            return
        for request, result in zip(group, results):
            request.future.set_result(result)

    def generate(self, group):
        """Returns one list of n choices per request of a group (equal group_key)."""
        model, head = self.model, group[0]
        processor = model.processor
        self.batch_sizes.append(len(group))
        # Pad the batch to a power of two (repeating the first prompt) so a server compiles one
        # set of programs per bucket, not one per number of requests that happened to arrive.
        rows = 1 << (len(group) - 1).bit_length()
        conversations = [r.conversation for r in group] + [head.conversation] * (rows - len(group))
        batch = processor(conversations, mode="generate")
        if head.temperature == 0:
            rng = None
        elif head.seed is not None:
            rng = jax.random.key(head.seed)
        else:
            self._calls += 1
            rng = jax.random.fold_in(self._rng, self._calls)
        steps = _bucket(max(r.max_tokens for r in group), self.max_tokens_limit)
        out = sampling.generate(
            model.cfg,
            model.params,
            batch["input_ids"],
            batch["attention_mask"],
            batch["pixel_values"],
            batch["image_grid_thw"],
            max_new_tokens=steps,
            num_samples=head.n,
            temperature=head.temperature,
            top_p=head.top_p,
            eos_token_ids=processor.eos_token_ids,
            pad_id=processor.pad_token_id,
            rng=rng,
        )
        tokens, logprobs, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs, out.lengths))
        prompt_tokens = np.asarray(batch["attention_mask"]).sum(axis=1)
        eos = set(int(t) for t in processor.eos_token_ids)
        results = []
        for b, request in enumerate(group):
            choices = []
            for j in range(head.n):
                row = b * head.n + j
                length = min(int(lengths[row]), request.max_tokens)
                ids = [int(t) for t in tokens[row, :length]]
                stopped = bool(ids) and ids[-1] in eos
                content = ids[:-1] if stopped else ids
                choices.append(
                    {
                        "ids": content,
                        "logprobs": [float(x) for x in logprobs[row, : len(content)]],
                        "generated": length,
                        "finish_reason": "stop" if stopped else "length",
                    }
                )
            results.append({"choices": choices, "prompt_tokens": int(prompt_tokens[b])})
        return results


def completion_body(model, request, result):
    """Returns the OpenAI chat.completion object of a Request's result."""
    tokenizer = model.processor.tokenizer
    choices, completion_tokens = [], 0
    for j, choice in enumerate(result["choices"]):
        completion_tokens += choice["generated"]
        logprobs = None
        if request.logprobs:
            pieces = [tokenizer.decode([t]) for t in choice["ids"]]
            logprobs = {
                "content": [
                    {
                        "token": p,
                        "logprob": lp,
                        "bytes": list(p.encode("utf-8")),
                        "top_logprobs": [],
                    }
                    for p, lp in zip(pieces, choice["logprobs"])
                ]
            }
        choices.append(
            {
                "index": j,
                "finish_reason": choice["finish_reason"],
                "logprobs": logprobs,
                "message": {
                    "role": "assistant",
                    "content": tokenizer.decode(choice["ids"], skip_special_tokens=True),
                },
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": choices,
        "usage": {
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": completion_tokens,
            "total_tokens": result["prompt_tokens"] + completion_tokens,
        },
    }


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------


def _error(status, message, kind="invalid_request_error"):
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


def make_app(
    model,
    batcher,
    *,
    max_tokens_limit=1024,
    max_n=16,
    max_body_bytes=DEFAULT_MAX_BODY_BYTES,
    max_image_pixels=processing.MAX_IMAGE_PIXELS,
):
    """Returns the Starlette app that answers the OpenAI routes from batcher.

    Long because the route handlers are closures over model, batcher and the limits; most of it is
    `chat_completions`, which rejects an oversize body, bad JSON and a wrong model name, in that
    order, before parsing and submitting the request.
    """
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat_completions(request):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return _error(
                413,
                f"request body of {declared} bytes exceeds the server's limit of {max_body_bytes} bytes",
            )
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                return _error(
                    413, f"request body exceeds the server's limit of {max_body_bytes} bytes"
                )
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not valid JSON: {e}")
        if isinstance(body, dict) and body.get("model") not in (None, model.name):
            return _error(
                404,
                f"model {body.get('model')!r} is not served here (this server has {model.name!r})",
                "not_found_error",
            )
        try:
            # Images are decoded off the event loop (they can be large).
            parsed = await asyncio.to_thread(
                parse_request,
                body,
                max_tokens_limit=max_tokens_limit,
                max_n=max_n,
                max_image_pixels=max_image_pixels,
            )
            result = await asyncio.wrap_future(batcher.submit(parsed))
        except RequestError as e:
            return _error(400, str(e))
        except Exception as e:  # noqa: BLE001 - the client gets a 500 naming the failure
            return _error(500, f"{type(e).__name__}: {e}", "server_error")
        return JSONResponse(completion_body(model, parsed, result))

    async def models(_):
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model.name, "object": "model", "owned_by": "mocojax"}],
            }
        )

    async def health(_):
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mocojax.serve", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="HF directory or workdir[@rl|@sft]")
    parser.add_argument(
        "--name", default=None, help="model name in requests and replies (default: the directory's)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--max_batch", type=int, default=16, help="prompts per sampler call at most"
    )
    parser.add_argument("--batch_window_ms", type=float, default=10.0)
    parser.add_argument("--max_tokens_limit", type=int, default=1024)
    parser.add_argument("--max_n", type=int, default=16)
    parser.add_argument("--max_body_mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20)
    parser.add_argument("--max_image_pixels", type=int, default=processing.MAX_IMAGE_PIXELS)
    parser.add_argument("--min_pixels", type=int, default=None)
    parser.add_argument("--max_pixels", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--seed", type=int, default=0, help="server rng for unseeded sampled requests"
    )
    args = parser.parse_args(argv)

    import uvicorn

    from mocojax.eval import suite

    try:
        model = load_model(
            args.model,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
            dtype=args.dtype,
            name=args.name,
        )
    except suite.SpecError as e:
        parser.exit(2, f"mocojax.serve: {e}\n")
    batcher = Batcher(
        model,
        window_s=args.batch_window_ms / 1000,
        max_batch=args.max_batch,
        max_tokens_limit=args.max_tokens_limit,
        seed=args.seed,
    )
    app = make_app(
        model,
        batcher,
        max_tokens_limit=args.max_tokens_limit,
        max_n=args.max_n,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_image_pixels=args.max_image_pixels,
    )
    print(f"mocojax.serve: {model.name} on http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        batcher.close()


if __name__ == "__main__":
    main()
