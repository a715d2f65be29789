"""Batching in mocojax.serve: 16 greedy requests one after another vs all at once (tiny random model).

JAX_PLATFORMS=cpu python benchmarks/bench_serve.py
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from serving_helpers import served, tiny_hf_dir  # noqa: E402

from mocojax import endpoint  # noqa: E402

N, TOKENS = 16, 32


def bodies(tag):
    return [
        {
            "messages": [endpoint.user_message(f"Describe scene {tag}{k}.")],
            "temperature": 0,
            "max_tokens": TOKENS,
            "n": 1,
        }
        for k in range(N)
    ]


with tempfile.TemporaryDirectory() as tmp, served(tiny_hf_dir(tmp)) as url:
    with endpoint.EndpointClient(url, "tiny", progress=False, concurrency=N) as client:
        for tag in "wxyz":  # warm-up: compiles the programs of the batch sizes that arrive
            client.chat_many(bodies(tag))
        client.chat(bodies("v")[0])
        start = time.perf_counter()
        for body in bodies("a"):
            client.chat(body)
        sequential = time.perf_counter() - start
        start = time.perf_counter()
        replies = client.chat_many(bodies("b"))
        concurrent = time.perf_counter() - start
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    print(
        f"{N} requests x {TOKENS} max tokens: one at a time {sequential:.2f} s, concurrent {concurrent:.2f} s "
        f"({sequential / concurrent:.1f}x); concurrent completion tokens {tokens}"
    )
