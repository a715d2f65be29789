"""The teacher clients of distill: LocalClient (a mocojax checkpoint answering in-process through
mocojax.serve) and make_client (an endpoint spec or a checkpoint to its client). Split from
mocojax/data/distill.py, which re-exports these names."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

from mocojax import endpoint
from mocojax.data import distill_ask

# ------------------------------------------------------------------------------------------------
# Clients
# ------------------------------------------------------------------------------------------------


class LocalClient:
    """A mocojax checkpoint (HF directory or workdir[@stage]) answering chat bodies in-process through
    mocojax.serve's request parser and batcher: the same replies the served checkpoint would give."""

    def __init__(
        self,
        spec,
        *,
        min_pixels=None,
        max_pixels=None,
        dtype="float32",
        max_batch=16,
        max_tokens_limit=4096,
        max_n=64,
        progress=True,
    ):
        from mocojax import serve

        self._serve = serve
        self.model = serve.load_model(
            spec, min_pixels=min_pixels, max_pixels=max_pixels, dtype=dtype
        )
        self.batcher = serve.Batcher(
            self.model, max_batch=max_batch, max_tokens_limit=max_tokens_limit
        )
        self.limits = dict(max_tokens_limit=max_tokens_limit, max_n=max_n)
        self.progress, self.stats = progress, {"sent": 0, "retries": 0, "cached": 0}

    def close(self):
        self.batcher.close()

    def chat_many(self, bodies, *, return_exceptions=False, desc="local"):
        pending = []
        for body in bodies:
            try:
                request = self._serve.parse_request(body, **self.limits)
                pending.append((request, self.batcher.submit(request)))
            except self._serve.RequestError as e:
                pending.append((None, endpoint.EndpointError(f"{self.model.name}: {e}", 400)))
        results = []
        for request, future in tqdm(pending, desc=desc, disable=not self.progress, leave=False):
            if isinstance(future, BaseException):
                results.append(future)
                continue
            self.stats["sent"] += 1
            try:
                results.append(self._serve.completion_body(self.model, request, future.result()))
            except Exception as e:  # noqa: BLE001 - a bad prompt (too long) is that request's error
                results.append(
                    endpoint.EndpointError(f"{self.model.name}: {type(e).__name__}: {e}", 400)
                )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not return_exceptions:
            raise errors[0]
        return results


def make_client(
    spec,
    *,
    cache_dir=None,
    concurrency=8,
    timeout=120.0,
    max_retries=5,
    api_key_env="OPENAI_API_KEY",
    min_pixels=None,
    max_pixels=None,
    progress=True,
):
    """Returns the client of a spec: "openai:URL#MODEL" (an EndpointClient caching under cache_dir)
    or a local checkpoint (LocalClient)."""
    if spec.startswith("openai:"):
        url, _, model = spec[len("openai:") :].partition("#")
        if not model:
            raise ValueError(f"{spec!r}: want openai:http(s)://host:port/v1#MODEL")
        return endpoint.EndpointClient(
            url,
            model,
            api_key=os.environ.get(api_key_env) if api_key_env else None,
            cache_dir=cache_dir,
            concurrency=concurrency,
            timeout=timeout,
            max_retries=max_retries,
            progress=progress,
        )
    return LocalClient(spec, min_pixels=min_pixels, max_pixels=max_pixels, progress=progress)


class CommandSession:
    """The shared frame of the teacher commands (`python -m mocojax.distill`, `mocojax.gold_mcq`):
    one client per distinct spec (`client`), the image records (`load_images`), and, as a context
    manager, each failure mapped to its exit code -- 2 for bad flags, records or a mismatched
    output (ValueError, FileNotFoundError), 1 for an endpoint that stops answering (DistillError,
    the finished images kept) -- with every client closed whichever step fails."""

    def __init__(self, prog, **client_options):
        self.prog, self.client_options, self.clients = prog, client_options, {}

    def fail(self, message, code):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(code)

    def client(self, spec):
        """Returns the client of a spec, made once (make_client with the session's options)."""
        if spec not in self.clients:
            self.clients[spec] = make_client(spec, **self.client_options)
        return self.clients[spec]

    def load_images(self, source, path, image_dir, strict, num_images=None):
        """Returns (image records, image root) (distill.load_images), the first num_images of
        them; exit 2 when none is usable."""
        from mocojax.data import distill  # the records readers (no import cycle at module load)

        records, image_root = distill.load_images(source, path, image_dir, strict)
        if num_images is not None:
            records = records[:num_images]
        if not records:
            self.fail(f"{path}: no usable image records", 2)
        return records, image_root

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        try:
            if isinstance(error, (ValueError, FileNotFoundError)):
                self.fail(error, 2)
            if isinstance(error, distill_ask.DistillError):
                self.fail(
                    f"{error}\n  the images finished so far are kept; rerun the same command to "
                    "resume",
                    1,
                )
        finally:
            for client in self.clients.values():
                client.close()
        return False


def define_command_flags():
    """Defines the flags every teacher command has (absl; call once, at the command module's
    import) and returns their holders: the input records and their format, the output, the
    endpoints' cache, concurrency, timeout and retries, local checkpoints' image bounds, strict
    records and progress bars. `session(prog, holders)` builds the CommandSession from them."""
    from absl import flags

    define = {
        "input": (
            flags.DEFINE_string,
            None,
            "Image records: records.py JSONL, or PixMo-Cap / DenseFusion rows.",
        ),
        "image_dir": (
            flags.DEFINE_string,
            None,
            "Image folder (default for jsonl: the input's folder).",
        ),
        "out": (
            flags.DEFINE_string,
            None,
            "Output records JSONL (with OUT.ledger.jsonl, OUT.summary.json, OUT.cache/).",
        ),
        "num_images": (flags.DEFINE_integer, None, "Use the first N images only."),
        "cache_dir": (flags.DEFINE_string, None, "Endpoint reply cache (default OUT.cache)."),
        "concurrency": (flags.DEFINE_integer, 8, "Requests in flight per endpoint."),
        "timeout": (flags.DEFINE_float, 300.0, "Seconds per HTTP request (connect, read, write)."),
        "max_retries": (
            flags.DEFINE_integer,
            5,
            "Retries of a failed request (transport, 429, 5xx).",
        ),
        "min_pixels": (flags.DEFINE_integer, None, "Local checkpoints: image resize bounds."),
        "max_pixels": (flags.DEFINE_integer, None, "Local checkpoints: image resize bounds."),
        "strict": (
            flags.DEFINE_boolean,
            False,
            "Stop at the first bad input record instead of skipping it.",
        ),
        "quiet": (flags.DEFINE_boolean, False, "No progress bars."),
    }
    holders = {name: fn(name, default, help_) for name, (fn, default, help_) in define.items()}
    holders["source"] = flags.DEFINE_enum(
        "source", "jsonl", ["jsonl", "pixmo_cap", "densefusion"], "Format of --input."
    )
    return holders


def session(prog, holders):
    """Returns the CommandSession of a command's flags (define_command_flags' holders)."""
    value = {name: holder.value for name, holder in holders.items()}
    return CommandSession(
        prog,
        cache_dir=value["cache_dir"] or value["out"] + ".cache",
        concurrency=value["concurrency"],
        timeout=value["timeout"],
        max_retries=value["max_retries"],
        min_pixels=value["min_pixels"],
        max_pixels=value["max_pixels"],
        progress=not value["quiet"],
    )


def load_command_images(command_session, holders):
    """Returns (image records, image root) of a command's --input, --source, --image_dir,
    --strict and --num_images."""
    value = {name: holder.value for name, holder in holders.items()}
    return command_session.load_images(
        value["source"], value["input"], value["image_dir"], value["strict"], value["num_images"]
    )
