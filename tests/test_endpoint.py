"""mocojax.endpoint: the OpenAI-compatible client against a real mocojax.serve and a fault-injecting server."""

import json
import os
import subprocess
import sys
import time

import pytest
from PIL import Image
from serving_helpers import app_in_thread, free_port, served, tiny_hf_dir
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from mocojax import endpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, progress=False)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with served(
        tiny_hf_dir(str(tmp_path_factory.mktemp("endpoint"))), "--max_image_pixels", "100000"
    ) as u:
        yield u


def _bodies():
    image = Image.new("RGB", (37, 53), (10, 200, 90))
    return [
        {
            "messages": [endpoint.user_message("Describe the image.", [image])],
            "temperature": 0,
            "max_tokens": 8,
        },
        {"messages": [endpoint.user_message("Name a colour.")], "temperature": 0, "max_tokens": 8},
        {
            "messages": [endpoint.user_message("Name a shape.")],
            "temperature": 0,
            "max_tokens": 6,
            "seed": 3,
        },
    ]


def _cache_files(cache):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(cache) for f in files)


def test_replies_come_from_the_server_once_then_from_the_cache(url, tmp_path):
    cache = str(tmp_path / "cache")
    with endpoint.EndpointClient(url, "tiny", cache_dir=cache, concurrency=3, **FAST) as client:
        first = client.chat_many(_bodies())
        assert client.stats == {"sent": 3, "retries": 0, "cached": 0}
    assert all(
        r["model"] == "tiny" and r["choices"][0]["message"]["role"] == "assistant" for r in first
    )
    files = _cache_files(cache)
    assert len(files) == 3 and not any(os.path.basename(f).startswith(".tmp-") for f in files)
    with endpoint.EndpointClient(url, "tiny", cache_dir=cache, **FAST) as client:
        again = client.chat_many(_bodies())
        assert client.stats == {"sent": 0, "retries": 0, "cached": 3}
        assert again == first
        # A different request (another max_tokens) is not a cache hit.
        client.chat({**_bodies()[1], "max_tokens": 7})
        assert client.stats["sent"] == 1


def test_server_rejections_are_not_retried_and_name_the_reason(url, tmp_path):
    big = Image.new("RGB", (400, 300))
    body = {"messages": [endpoint.user_message("Describe.", [big])], "max_tokens": 4}
    with endpoint.EndpointClient(url, "tiny", cache_dir=str(tmp_path / "c"), **FAST) as client:
        with pytest.raises(
            endpoint.EndpointError, match="HTTP 400: .*more than 100000 pixels"
        ) as info:
            client.chat(body)
        assert info.value.status == 400 and client.stats == {"sent": 1, "retries": 0, "cached": 0}
        results = client.chat_many([body, _bodies()[1]], return_exceptions=True)
    assert isinstance(results[0], endpoint.EndpointError) and results[1]["choices"]
    assert len(_cache_files(str(tmp_path / "c"))) == 1  # only the answered request


def test_evaluate_uses_an_openai_judge(url, tmp_path):
    out = tmp_path / "eval"
    command = [
        sys.executable,
        "-m",
        "mocojax.evaluate",
        "--config",
        "configs/toyworld.py:tiny",
        "--workdir",
        str(out),
        "--model",
        "toy:reference",
        "--against",
        "toy:blind",
        "--protocols",
        "winrate",
        "--judge",
        f"openai:{url}#tiny",
        "--num_images",
        "2",
    ]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["protocols"]["winrate"]["judge"] == f"tiny@{url}"
    cached = _cache_files(str(out / "endpoint_cache"))
    assert len(cached) >= 2
    again = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert again.returncode == 0 and _cache_files(str(out / "endpoint_cache")) == cached


# -- faults ---------------------------------------------------------------------------------------

REPLY = {
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


@pytest.fixture(scope="module")
def faulty():
    """A real local HTTP server (Starlette + uvicorn in a thread) whose routes misbehave on purpose."""
    hits = {}

    def route(name, behave):
        async def handler(request):
            await request.body()
            hits[name] = hits.get(name, 0) + 1
            return await behave(hits[name])

        return Route(f"/{name}/v1/chat/completions", handler, methods=["POST"])

    async def flaky(n):  # two 503s, then a reply
        return (
            JSONResponse({"error": {"message": "overloaded"}}, 503)
            if n <= 2
            else JSONResponse(REPLY)
        )

    async def ratelimited(n):
        return (
            JSONResponse({"error": {"message": "slow down"}}, 429, headers={"Retry-After": "0"})
            if n == 1
            else JSONResponse(REPLY)
        )

    async def slow(n):
        import asyncio

        await asyncio.sleep(2)
        return JSONResponse(REPLY)

    async def malformed(n):
        return PlainTextResponse('{"choices": [', 200, media_type="application/json")

    async def forbidden(n):
        return JSONResponse({"error": {"message": "bad key"}}, 401)

    app = Starlette(
        routes=[
            route("flaky", flaky),
            route("ratelimited", ratelimited),
            route("slow", slow),
            route("malformed", malformed),
            route("forbidden", forbidden),
        ]
    )
    with app_in_thread(app) as base:
        yield base, hits


BODY = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def test_5xx_and_429_are_retried_until_success(faulty, tmp_path):
    base, hits = faulty
    for name, retries in (("flaky", 2), ("ratelimited", 1)):
        with endpoint.EndpointClient(
            f"{base}/{name}/v1", "m", cache_dir=str(tmp_path / name), **FAST
        ) as client:
            assert endpoint.texts([client.chat(BODY)]) == ["ok"]
            assert client.stats["retries"] == retries and hits[name] == retries + 1
        assert len(_cache_files(str(tmp_path / name))) == 1


@pytest.mark.parametrize(
    "name, kwargs, message, attempts",
    [
        ("malformed", {}, "malformed reply body", 3),
        ("slow", {"timeout": 0.3}, "timed out", 3),
        ("forbidden", {}, "HTTP 401: bad key", 1),
    ],
)
def test_failures_raise_clear_errors_and_write_nothing(
    faulty, tmp_path, name, kwargs, message, attempts
):
    base, hits = faulty
    before = hits.get(name, 0)
    with endpoint.EndpointClient(
        f"{base}/{name}/v1", "m", cache_dir=str(tmp_path), max_retries=2, **kwargs, **FAST
    ) as client:
        with pytest.raises(endpoint.EndpointError, match=message) as info:
            client.chat(BODY)
    if attempts > 1:
        assert f"gave up after {attempts} attempts" in str(info.value)
    time.sleep(0.1 if name != "slow" else 2.2)  # let the slow handler count its hits
    assert hits[name] - before == attempts
    assert _cache_files(str(tmp_path)) == []


def test_an_unreachable_endpoint_is_retried_then_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    start = time.monotonic()
    with endpoint.EndpointClient(
        url, "m", cache_dir=str(tmp_path), max_retries=2, **FAST
    ) as client:
        with pytest.raises(
            endpoint.EndpointError, match="cannot reach the endpoint.*gave up after 3 attempts"
        ):
            client.chat(BODY)
        assert client.stats["retries"] == 2
    assert time.monotonic() - start < 10 and _cache_files(str(tmp_path)) == []
