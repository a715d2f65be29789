"""mocojax.distill: teacher-built role SFT records against a scripted OpenAI-compatible teacher (a real
HTTP server): checks with the role parsers, re-asks and drops, request errors, the committee mode,
resume after kill -9 and repair of torn files. tests/test_real_format.py runs it on mocojax.serve."""

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from distill_helpers import BAD_TEXT, image_tag, scripted_teacher
from PIL import Image
from serving_helpers import free_port

from mocojax import endpoint, processing
from mocojax.data import distill, records as records_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, progress=False, max_retries=1)
SIZES = [(97, 61), (45, 123), (200, 150), (33, 77), (64, 64), (120, 35)]


def write_images(folder, count=len(SIZES), sizes=SIZES):
    """Writes `count` textured JPEG/PNG files of odd sizes and their records JSONL; returns its path."""
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    with open(os.path.join(folder, "images.jsonl"), "w") as f:
        for k in range(count):
            w, h = sizes[k % len(sizes)]
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            name = f"img/{k:03d}.{'jpg' if k % 2 == 0 else 'png'}"
            Image.fromarray(pixels).save(os.path.join(folder, name))
            f.write(
                json.dumps(
                    {
                        "id": f"im{k}",
                        "image": name,
                        "references": [
                            f"A red kite over a beach, picture {k}.",
                            f"Sand and sky {k}.",
                        ],
                    }
                )
                + "\n"
            )
    return os.path.join(folder, "images.jsonl")


def _teachers(url, cache, **parts):
    client = endpoint.EndpointClient(url, "teacher", cache_dir=cache, **FAST)
    student = endpoint.EndpointClient(url, "student", cache_dir=cache, **FAST)
    return distill.Teachers(
        policy=parts.get("policy", client),
        generator=parts.get("generator", client),
        judge=parts.get("judge", client),
        student=student,
        committee=parts.get("committee", []),
        names={"teacher": url},
    )


def _run(folder, url, options=None, **parts):
    records, root = distill.load_images("jsonl", os.path.join(folder, "images.jsonl"))
    out = os.path.join(folder, "sft.jsonl")
    teachers = _teachers(url, out + ".cache", **parts)
    summary = distill.run(
        records,
        teachers,
        options or distill.Options(num_candidates=3, chunk_size=4),
        out,
        root,
        progress=False,
    )
    return out, summary


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def tag(folder, k):
    """The scripted teacher's image_tag of image k of write_images (what distill sends for it)."""
    path = os.path.join(folder, "img", f"{k:03d}.{'jpg' if k % 2 == 0 else 'png'}")
    url = endpoint.image_data_url(processing.load_image(path))
    return image_tag(
        {"messages": [{"content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    )


def test_records_load_into_sft_and_bad_replies_are_reasked_or_dropped(tmp_path):
    folder = str(tmp_path)
    write_images(folder)
    flaky = {tag(folder, 0), tag(folder, 3)}

    def bad(kind, body):
        first = "seed" not in body  # the first ask is greedy; re-asks sample with a seed
        caption = (
            body["messages"][-1]["content"][0]["text"].rsplit("\n", 1)[-1]
            if kind == "judge"
            else ""
        )
        return (
            (kind == "generator" and first and image_tag(body) in flaky)  # recovered by a re-ask
            or (kind == "judge" and caption.endswith(".1"))
        )  # always bad: dropped after 3 asks

    with scripted_teacher(bad=bad) as (url, received):
        out, summary = _run(folder, url)
    records, report = records_lib.load_jsonl(out, strict=True)
    assert len(records) == 6 and report.kept == 6
    examples = records_lib.sft_examples(records)
    by_role = {r: [e for e in examples if e["role"] == r] for r in records_lib.ROLES}
    # One teacher caption per image (not the references), one rubric per image, candidates c0, c2 judged.
    assert len(by_role["policy"]) == 6 and all(
        e["target"].startswith("A photo ") for e in by_role["policy"]
    )
    assert len(by_role["generator"]) == 6 and len(by_role["judge"]) == 12
    assert {e["id"].rsplit("/", 1)[1] for e in by_role["judge"]} == {"c0", "c2"}
    for record in records:  # the student's n=3 samples (seed 0), the rubric from the two references
        assert [c["caption"].rsplit(" ", 1)[1] for c in record["candidates"]] == [
            "0.0",
            "0.1",
            "0.2",
        ]
        assert [i.weight for i in record["rubric"]] == [3.0, 2.0]
        assert record["rubric"][0].criterion == "names the a red kite"
    assert BAD_TEXT not in open(out).read()
    parts = summary["parts"]
    assert parts["generator"] == {"asked": 8, "bad": 2, "dropped": 0, "errors": 0}
    assert parts["judge"] == {"asked": 12 + 18, "bad": 18, "dropped": 6, "errors": 0}
    assert parts["policy"] == {"asked": 6, "bad": 0, "dropped": 0, "errors": 0}
    assert summary["images"] == {"written": 6, "dropped": 0}
    assert summary["sft_examples"] == {"policy": 6, "generator": 6, "judge": 12}
    assert dict(summary["top_problems"]) == {
        "no rubric items found": 2,
        "missing decisions for items [1, 2], counted as 0": 18,
    }
    ledger = _lines(distill.ledger_path(out))
    assert ledger[0]["options"]["num_candidates"] == 3 and len(ledger) == 7
    assert sum(len(e["rejects"]) for e in ledger[1:]) == 20
    assert all(r["text"] == BAD_TEXT for e in ledger[1:] for r in e["rejects"])
    assert json.load(open(out + ".summary.json"))["parts"] == parts
    asked = len(received)

    # A rerun of a finished set asks nothing and writes nothing.
    with scripted_teacher() as (url2, received2):
        _run(folder, url2)
    assert received2 == [] and len(_lines(out)) == 6 and len(received) == asked


def test_an_image_with_no_usable_output_is_dropped_not_written(tmp_path):
    folder = str(tmp_path)
    write_images(folder, 3)
    broken = tag(folder, 0)
    with scripted_teacher(bad=lambda kind, body: image_tag(body) == broken) as (url, _):
        out, summary = _run(folder, url, distill.Options(num_candidates=2, chunk_size=3))
    assert [r["id"] for r in _lines(out)] == ["im1", "im2"]
    assert summary["images"] == {"written": 2, "dropped": 1}
    dropped = _lines(distill.ledger_path(out))[1]
    assert dropped["status"] == "dropped" and dropped["record"] is None
    # Its caption and its candidates were bad 3 times each; no rubric was asked (no candidates).
    assert dropped["bad"] == {"policy": 3, "candidates": 3} and dropped["dropped"] == {
        "policy": 1,
        "candidates": 1,
    }
    assert summary["parts"]["generator"]["asked"] == 2


def test_a_refused_rubric_request_is_an_error_not_a_reask(tmp_path):
    folder = str(tmp_path)
    write_images(folder, 2)
    with scripted_teacher(status=lambda kind, body: 413 if kind == "generator" else None) as (
        url,
        received,
    ):
        out, summary = _run(
            folder, url, distill.Options(num_candidates=2, chunk_size=2, image_max_pixels=5700)
        )
    # The 45x123 image (5,535 pixels) went out whole, the 97x61 one (5,917) downscaled to 5,700 at most.
    sent = {
        Image.open(io.BytesIO(base64.b64decode(_image_url(body).split(",", 1)[1]))).size
        for _, body in received
        if _image_url(body)
    }
    assert sent == {(45, 123), (95, 59)}
    assert summary["parts"]["generator"] == {"asked": 2, "bad": 0, "dropped": 0, "errors": 2}
    assert sum(kind == "generator" for kind, _ in received) == 2
    records, _ = records_lib.load_jsonl(out, strict=True)
    assert all("rubric" not in r and len(r["policy_targets"]) == 1 for r in records)
    entry = _lines(distill.ledger_path(out))[1]
    assert "HTTP 413: scripted 413 for generator" in entry["errors"][0]


def _image_url(body):
    content = body["messages"][-1]["content"]
    return (
        next((p["image_url"]["url"] for p in content if p["type"] == "image_url"), "")
        if isinstance(content, list)
        else ""
    )


def test_a_failing_endpoint_stops_the_run_with_whole_images_written(tmp_path):
    folder = str(tmp_path)
    write_images(folder, 4)
    down = {tag(folder, 2), tag(folder, 3)}  # the second chunk's images: 503 after retries
    with scripted_teacher(status=lambda kind, body: 503 if image_tag(body) in down else None) as (
        url,
        _,
    ):
        with pytest.raises(distill.DistillError, match="HTTP 503.*gave up after 2 attempts"):
            _run(folder, url, distill.Options(num_candidates=2, chunk_size=2))
    out = os.path.join(folder, "sft.jsonl")
    assert [r["id"] for r in _lines(out)] == ["im0", "im1"]
    assert [e["id"] for e in _lines(distill.ledger_path(out))[1:]] == ["im0", "im1"]


def test_committee_rubrics_keep_the_consensus_facts(tmp_path):
    folder = str(tmp_path)
    write_images(folder, 2)
    with scripted_teacher() as (url, received):
        out, summary = _run(
            folder,
            url,
            distill.Options(
                num_candidates=2, chunk_size=2, rubric_mode="committee", committee_size=3
            ),
        )
    records, _ = records_lib.load_jsonl(out, strict=True)
    assert all(
        [(i.criterion, i.weight) for i in r["rubric"]] == [("mentions a red kite", 3.0)]
        for r in records
    )
    assert all(set(r["decisions"]) == {"c0", "c1"} for r in records)
    entries = _lines(distill.ledger_path(out))[1:]
    # Three committee captions (one greedy, two sampled with different seeds); the fact only one states is gone.
    assert all(len(set(e["committee"])) == 3 and e["consensus"] == ["a red kite"] for e in entries)
    kinds = [kind for kind, _ in received]
    assert kinds.count("consensus") == 2 and kinds.count("committee_rubric") == 2
    assert summary["parts"]["committee"]["asked"] == 6 and summary["parts"]["consensus"]["bad"] == 0


def test_torn_files_are_repaired_and_other_settings_refused(tmp_path):
    out = str(tmp_path / "sft.jsonl")
    header = {"options": {"seed": 0}, "teachers": {"policy": "a"}, "source": "x"}
    record = {"id": "a", "image": "a.png", "references": ["r"], "policy_targets": ["t"]}
    entry = {
        "id": "a",
        "status": "written",
        "record": record,
        "asked": {},
        "bad": {},
        "dropped": {},
        "errors": [],
        "rejects": [],
    }
    with open(distill.ledger_path(out), "w") as f:
        f.write(json.dumps(header) + "\n" + json.dumps(entry) + "\n" + '{"id": "b", "sta')
    with open(out, "w") as f:
        f.write('{"id": "a", "ima')  # killed while writing a's record
    entries, ledger, records = distill.open_outputs(out, header)
    ledger.close(), records.close()
    assert [e["id"] for e in entries] == ["a"]
    assert _lines(out) == [record] and len(_lines(distill.ledger_path(out))) == 2
    with pytest.raises(ValueError, match=r"other settings \(seed\)"):
        distill.open_outputs(out, {**header, "options": {"seed": 1}})
    with open(distill.ledger_path(out), "a") as f:
        f.write("not json\n" + json.dumps(entry) + "\n")
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        distill.open_outputs(out, header)


def _cli(folder, url, *extra):
    return [
        sys.executable,
        "-m",
        "mocojax.distill",
        "--input",
        os.path.join(folder, "images.jsonl"),
        "--out",
        os.path.join(folder, "sft.jsonl"),
        "--teacher",
        f"openai:{url}#teacher",
        "--student",
        f"openai:{url}#student",
        "--num_candidates",
        "2",
        "--chunk_size",
        "1",
        "--quiet",
        "--max_retries",
        "1",
        *extra,
    ]


def test_resume_after_kill_9_loses_and_duplicates_nothing(tmp_path):
    images = str(tmp_path / "ref")
    write_images(images, 5)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    with scripted_teacher() as (url, received):
        reference = subprocess.run(
            _cli(images, url), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert reference.returncode == 0, reference.stderr[-2000:]
        assert "images: 5 written, 0 dropped" in reference.stdout
        uninterrupted = len(received)
    folder = str(tmp_path / "killed")
    write_images(folder, 5)
    with scripted_teacher(delay_s=0.15) as (url, received):
        proc = subprocess.Popen(
            _cli(folder, url),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        ledger = distill.ledger_path(os.path.join(folder, "sft.jsonl"))
        deadline = time.monotonic() + 240
        while not (
            os.path.exists(ledger) and len(open(ledger).readlines()) >= 3
        ):  # header + 2 images
            assert proc.poll() is None and time.monotonic() < deadline, (
                "distill ended before the kill"
            )
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before_kill = len(received)
        assert len(_lines(os.path.join(folder, "sft.jsonl"))) < 5
        again = subprocess.run(
            _cli(folder, url), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert again.returncode == 0, again.stderr[-2000:]
    ids = [r["id"] for r in _lines(os.path.join(folder, "sft.jsonl"))]
    assert sorted(ids) == [f"im{k}" for k in range(5)] and len(ids) == len(set(ids))
    ref = {r["id"]: r for r in _lines(os.path.join(images, "sft.jsonl"))}
    assert {r["id"]: r for r in _lines(os.path.join(folder, "sft.jsonl"))} == ref
    # The rerun re-sent at most the requests in flight at the kill (replies not cached yet): a phase of
    # one image asks at most 2 at a time here (caption + candidates, or 2 judgements).
    assert before_kill <= len(received) <= uninterrupted + 2
    assert "images: 5 written" in again.stdout


def test_cli_refuses_bad_flags_and_unreachable_endpoints(tmp_path):
    folder = str(tmp_path)
    write_images(folder, 1)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    bad = subprocess.run(
        _cli(folder, "http://127.0.0.1:9/v1", "--max_asks", "0"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "max_asks=0: must be an int >= 1" in bad.stderr
    down = subprocess.run(
        _cli(folder, f"http://127.0.0.1:{free_port()}/v1"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        down.returncode == 1
        and "cannot reach the endpoint" in down.stderr
        and "rerun the same command" in down.stderr
    )
    assert (
        not os.path.exists(os.path.join(folder, "sft.jsonl"))
        or not open(os.path.join(folder, "sft.jsonl")).read()
    )


def test_policy_targets_replace_the_references_as_policy_targets(tmp_path):
    Image.new("RGB", (50, 70)).save(tmp_path / "a.png")
    base = {"id": "a", "image": "a.png", "references": ["ref one", "ref two"]}
    rows = [
        {**base, "id": "given", "policy_targets": ["teacher caption"]},
        {**base, "id": "none", "policy_targets": []},
        {**base, "id": "absent"},
        {**base, "id": "number", "policy_targets": 5},
        {**base, "id": "blank", "policy_targets": ["  "]},
    ]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, report = records_lib.load_jsonl(str(tmp_path / "r.jsonl"))
    assert dict(report.skipped) == {"missing_field": 1, "empty_caption": 1}
    targets = {}
    for example in records_lib.sft_examples(records):
        targets.setdefault(example["id"].split("/")[0], []).append(example["target"])
    assert targets == {"given": ["teacher caption"], "absent": ["ref one", "ref two"]}
