"""A scripted OpenAI-compatible teacher for tests/test_distill.py and tests/test_real_format.py: a real
HTTP server (Starlette + uvicorn in a thread) that answers each role's prompt in its format, the
stand-in for a capable hosted teacher. Replies are a pure function of the request body (so a
resumed run and an uninterrupted one get the same), and `bad(kind, body)` / `status(kind, body)`
make chosen requests misbehave."""

import contextlib
import hashlib
import json
import re
import threading
import time

from serving_helpers import app_in_thread
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from mocojax import roles
from mocojax.data import distill

BAD_TEXT = "Sure! Here is what I think about the image, in prose and without any format."  # a bad rubric / decisions
# A bad caption is an empty one (prose is a caption).


def _prompt(body):
    """Returns (the last user message's text, the image data URL or '')."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content, ""
    text = "".join(p.get("text", "") for p in content if p["type"] == "text")
    url = next((p["image_url"]["url"] for p in content if p["type"] == "image_url"), "")
    return text, url


def kind_of(body):
    """Returns the part a request asks for: policy, generator, judge, consensus or committee_rubric."""
    text, _ = _prompt(body)
    if text.startswith(roles.JUDGE_INSTRUCTION):
        return "judge"
    if text.startswith(roles.GENERATOR_INSTRUCTION):
        return "generator"
    if text.startswith(distill.COMMITTEE_INSTRUCTION):
        return "committee_rubric"
    if text.startswith("Here are ") and "captions of this image by different describers" in text:
        return "consensus"
    return "policy"


def _section(text, start, end=None):
    part = text.split(start, 1)[1]
    part = part.split(end, 1)[0] if end else part
    return [re.sub(r"^\d+\. ", "", line) for line in part.strip().splitlines() if line.strip()]


def image_tag(body):
    """A short name of the request's image (the same image gives the same tag)."""
    return hashlib.sha256(_prompt(body)[1].encode()).hexdigest()[:6]


def answer(kind, body, j=0):
    """Returns the well-formed reply text of a request (choice j)."""
    text, _ = _prompt(body)
    if kind == "policy":
        return f"A photo {image_tag(body)} with a red kite over a beach, draw {body.get('seed', 0)}.{j}"
    if kind == "generator":
        refs = _section(text, "References:\n", "\nCandidates:\n")
        return "\n".join(
            f"{k} | {3 if k == 1 else 2} | names the {' '.join(r.split()[:3]).lower()} | "
            "the caption says it"
            for k, r in enumerate(refs, 1)
        )
    if kind == "judge":
        items = _section(text, "Rubric:\n", "\nCaption:\n")
        caption = text.split("\nCaption:\n", 1)[1]
        return "\n".join(
            f"{k} | {int('kite' in caption)} | {'named' if 'kite' in caption else 'absent'}"
            for k in range(1, len(items) + 1)
        )
    if kind == "consensus":
        k = len(_section(text, "caption numbers.\n"))
        return f"1 | {k} | a red kite | 1, 2\n2 | 1 | a dog on the sand | 2"
    facts = _section(text, "Consensus facts:\n", "\nCandidates:\n")
    return "\n".join(
        f"{k} | 3 | mentions {f} | the caption names {f}" for k, f in enumerate(facts, 1)
    )


@contextlib.contextmanager
def scripted_teacher(bad=None, status=None, delay_s=0.0):
    """Serves a scripted teacher; yields (base URL .../v1, list of (kind, body) received)."""
    received, lock = [], threading.Lock()

    async def chat(request):
        body = json.loads(await request.body())
        kind = kind_of(body)
        with lock:
            received.append((kind, body))
        if delay_s:
            time.sleep(delay_s)  # blocks the loop: requests are served one at a time, slowly
        code = status(kind, body) if status else None
        if code:
            return JSONResponse({"error": {"message": f"scripted {code} for {kind}"}}, code)
        is_bad = bad is not None and bad(kind, body)
        choices = [
            {
                "index": j,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": ("" if kind == "policy" else BAD_TEXT)
                    if is_bad
                    else answer(kind, body, j),
                },
            }
            for j in range(body.get("n", 1))
        ]
        return JSONResponse(
            {"object": "chat.completion", "model": body.get("model"), "choices": choices}
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with app_in_thread(app) as base:
        yield f"{base}/v1", received
