"""mocojax.serve: the OpenAI-compatible server against the jitted sampler it wraps."""

import concurrent.futures
import json

import httpx
import numpy as np
import pytest
from serving_helpers import PIXELS, data_url, served, tiny_hf_dir

from mocojax import processing, sampling, serve


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_hf_dir(str(tmp_path_factory.mktemp("serve")))


@pytest.fixture(scope="module")
def local(model_dir):
    """The same checkpoint loaded in this process, as the server loads it."""
    return serve.load_model(model_dir, min_pixels=PIXELS, max_pixels=PIXELS, name="tiny")


@pytest.fixture(scope="module")
def url(model_dir):
    with served(
        model_dir,
        "--max_body_mb",
        "0.5",
        "--max_image_pixels",
        "100000",
        "--max_tokens_limit",
        "64",
    ) as u:
        yield u


def _post(url, body, timeout=120):
    return httpx.post(f"{url}/chat/completions", content=json.dumps(body), timeout=timeout)


TEXT = [{"role": "user", "content": "Describe the image in detail."}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": data_url()}},
            {"type": "text", "text": "Describe the image in detail."},
        ],
    }
]


def _reference(local, messages, max_tokens):
    """Greedy (text, logprobs) from sampling.generate directly, on the processor's own conversation."""
    conversation = [
        {
            "role": m["role"],
            "content": m["content"]
            if isinstance(m["content"], str)
            else [
                {"type": "text", "text": p["text"]}
                if p["type"] == "text"
                else {
                    "type": "image",
                    "image": processing.load_image(
                        serve.base64.b64decode(p["image_url"]["url"].split(",")[1])
                    ),
                }
                for p in m["content"]
            ],
        }
        for m in messages
    ]
    p = local.processor
    batch = p([conversation], mode="generate")
    out = sampling.generate(
        local.cfg,
        local.params,
        batch["input_ids"],
        batch["attention_mask"],
        batch["pixel_values"],
        batch["image_grid_thw"],
        max_new_tokens=max_tokens,
        eos_token_ids=p.eos_token_ids,
        pad_id=p.pad_token_id,
    )
    n = int(out.lengths[0])
    ids = [int(t) for t in np.asarray(out.tokens[0, :n])]
    if ids and ids[-1] in p.eos_token_ids:
        ids = ids[:-1]
    return (
        p.tokenizer.decode(ids, skip_special_tokens=True),
        np.asarray(out.logprobs[0, : len(ids)]),
        ids,
    )


@pytest.mark.parametrize("messages", [TEXT, IMAGE], ids=["text", "image"])
def test_greedy_reply_equals_sampling_generate(url, local, messages):
    response = _post(
        url,
        {
            "model": "tiny",
            "messages": messages,
            "temperature": 0,
            "max_tokens": 12,
            "logprobs": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    text, logprobs, ids = _reference(local, messages, 12)
    assert len(ids) > 0
    assert choice["message"]["content"] == text
    assert [t["token"] for t in choice["logprobs"]["content"]] == [
        local.processor.tokenizer.decode([i]) for i in ids
    ]
    np.testing.assert_allclose(
        [t["logprob"] for t in choice["logprobs"]["content"]], logprobs, atol=1e-4
    )
    assert choice["finish_reason"] == ("length" if len(ids) == 12 else "stop")
    assert body["usage"]["completion_tokens"] == min(12, len(ids) + 1)
    assert body["object"] == "chat.completion" and body["model"] == "tiny"


def test_concurrent_requests_share_one_sampler_call_and_match_their_solo_replies(local):
    batcher = serve.Batcher(local, window_s=1.0, max_batch=8, max_tokens_limit=64)
    try:
        prompts = [[{"role": "user", "content": f"Describe scene {k}."}] for k in range(3)]
        make = lambda m, n=8: serve.parse_request(
            {"messages": m, "temperature": 0, "max_tokens": n},  # noqa: E731
            max_tokens_limit=64,
            max_n=4,
        )
        futures = [batcher.submit(make(m, 8 + k)) for k, m in enumerate(prompts)]
        together = [f.result(timeout=300) for f in futures]
        assert batcher.batch_sizes == [3]
        alone = [batcher.submit(make(m, 8 + k)).result(timeout=300) for k, m in enumerate(prompts)]
        assert batcher.batch_sizes == [3, 1, 1, 1]
        for k, (a, b) in enumerate(zip(together, alone)):
            assert a["choices"][0]["ids"] == b["choices"][0]["ids"]
            assert a["choices"][0]["generated"] <= 8 + k  # each request's own max_tokens
            np.testing.assert_allclose(
                a["choices"][0]["logprobs"], b["choices"][0]["logprobs"], atol=1e-4
            )
    finally:
        batcher.close()


def test_seeded_sampling_is_reproducible_and_n_gives_n_choices(url):
    body = {
        "model": "tiny",
        "messages": IMAGE,
        "temperature": 1.0,
        "top_p": 0.9,
        "max_tokens": 10,
        "n": 3,
        "seed": 7,
    }
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda b: _post(url, b).json(), [body, body, {**body, "seed": 8}]))
    texts = [[c["message"]["content"] for c in r["choices"]] for r in replies]
    assert len(texts[0]) == 3 and [c["index"] for c in replies[0]["choices"]] == [0, 1, 2]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"messages": TEXT, "stream": True}, 400, "stream"),
        ({"messages": TEXT, "max_tokens": 65}, 400, "max_tokens=65"),
        ({"messages": TEXT, "model": "other"}, 404, "'other' is not served"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, "last message"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}],
                    }
                ]
            },
            400,
            "only base64 data: URLs",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAAA"},
                            }
                        ],
                    }
                ]
            },
            400,
            "cannot decode image",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": data_url((400, 300))}}
                        ],
                    }
                ]
            },
            400,
            "more than 100000 pixels",
        ),
        (
            {"messages": [{"role": "user", "content": "x" * 600_000}]},
            413,
            "exceeds the server's limit",
        ),
    ],
)
def test_bad_requests_get_clear_errors(url, body, status, words):
    content = body if isinstance(body, bytes) else json.dumps(body)
    response = httpx.post(f"{url}/chat/completions", content=content, timeout=60)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_models_route_names_the_served_model(url):
    assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["tiny"]


def test_a_workdir_is_served_from_its_config_and_newest_checkpoint(tmp_path):
    import jax

    from configs import toyworld
    from mocojax import checkpoint, config_utils

    config = toyworld.get_config("tiny")
    workdir = str(tmp_path)
    (tmp_path / "config.json").write_text(config.to_json_best_effort())  # as mocojax.main writes it
    params = config_utils.build_setup(config, workdir).load_params()
    manager = checkpoint.Manager(workdir, "sft", keep=1)
    manager.save(3, {"params": params, "step": np.int32(3), "rng": jax.random.key(0)}, {})
    manager.close()
    loaded = serve.load_model(workdir)
    assert loaded.name == f"{tmp_path.name}_sft"
    assert loaded.cfg == config_utils.build_setup(config, workdir).model_config
    np.testing.assert_array_equal(jax.tree.leaves(loaded.params)[0], jax.tree.leaves(params)[0])
    batcher = serve.Batcher(loaded)
    try:
        reply = batcher.generate(
            [
                serve.parse_request(
                    {"messages": TEXT, "temperature": 0, "max_tokens": 4},
                    max_tokens_limit=64,
                    max_n=1,
                )
            ]
        )
    finally:
        batcher.close()
    assert reply[0]["choices"][0]["generated"] <= 4
