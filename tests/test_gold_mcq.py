"""Gold-MCQs of real images through a teacher endpoint (`python -m mocojax.gold_mcq`, issue #19):
the writer's line format and its checks by hand, the option shuffle, the `mcq` field of image
records, and the command end to end against a scripted teacher served over HTTP on a local port
(uvicorn in a thread): re-asks, the judge's verification (answerable from the references, not
from no text), drops, counts, resume after a kill, exit codes."""

import contextlib
import json
import os
import re
import subprocess
import sys
import threading

import pytest
from serving_helpers import app_in_thread
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_distill import write_images

from mocojax import acecap
from mocojax.data import gold_mcq, records as records_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------ the line format


def test_parse_questions_keeps_good_lines_and_names_each_bad_one():
    text = "\n".join(
        [
            "Here are the questions:",  # prose: not a question line
            "1 | What flies over the beach? | a kite | a bird | a plane | a balloon | A",
            "2 | Is there sand? | yes | no | (a)",  # two options; a lower-case letter in brackets
            "3 | What colour is the kite? | red | blue | Not given | green | A",  # Not Given is E's
            "4 | How many kites? | one | two | three | four | E",  # E is never gold
            "5 | Where is the kite? | left | left | right | up | C",  # two options the same
            "6 | What flies over the beach? | a kite | a gull | B",  # a repeat
            "7 | Which one? | a | b | c | d | e | A",  # five options
            "8 |  | a | b | A",  # no question
        ]
    )
    items, problems = gold_mcq.parse_questions(text)
    assert [(i.question, i.options, i.answer, i.kind) for i in items] == [
        ("What flies over the beach?", ("a kite", "a bird", "a plane", "a balloon"), "A", "text"),
        ("Is there sand?", ("yes", "no"), "A", "text"),
    ]
    assert len(problems) == 7
    assert problems[0].startswith("line 1: want")
    assert "Not Given, which only E may" in problems[1]
    assert "gold letter 'E'" in problems[2] and "never gold" in problems[2]
    assert "two options say the same" in problems[3]
    assert "repeats an earlier question" in problems[4]
    assert "want 2-4 options" in problems[5]
    assert "empty question" in problems[6]
    assert gold_mcq.parse_questions(None) == ([], [])


def test_shuffled_options_keep_the_gold_text_and_spread_its_letter():
    item = acecap.text_item("What flies?", ["a kite", "a bird", "a plane", "a balloon"], "A")
    letters = set()
    for k in range(40):
        question = item._replace(question=f"What flies, {k}?")
        moved = gold_mcq.shuffled(question, "im0", seed=0)
        assert sorted(moved.options) == sorted(item.options)
        assert moved.options[acecap.LETTERS.index(moved.answer)] == "a kite"
        assert gold_mcq.shuffled(question, "im0", seed=0) == moved  # deterministic
        letters.add(moved.answer)
    assert letters == set("ABCD")


def test_image_records_carry_validated_gold_mcq_items(tmp_path):
    path = write_images(str(tmp_path), 3)
    rows = [json.loads(line) for line in open(path)]
    rows[0]["mcq"] = [{"question": "Is there sand?", "options": ["yes", "no"], "answer": "A"}]
    rows[1]["mcq"] = [{"question": "Is there sand?", "options": ["yes", "no"], "answer": "E"}]
    rows[2]["mcq"] = []
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    records, report = records_lib.load_jsonl(path)
    assert [r["id"] for r in records] == ["im0"]
    assert records[0]["mcq"] == [acecap.text_item("Is there sand?", ["yes", "no"], "A")]
    assert dict(report.skipped) == {"bad_mcq": 2}
    with pytest.raises(records_lib.BadRecord, match=r"im1.*mcq\[0\].*gold letter 'E'"):
        records_lib.load_jsonl(path, strict=True)


def test_options_are_checked():
    with pytest.raises(ValueError, match="min_questions=9 > num_questions=8"):
        gold_mcq.Options(min_questions=9).check()
    with pytest.raises(ValueError, match="sample_temperature=0"):
        gold_mcq.Options(sample_temperature=0.0).check()


# ------------------------------------------------------------------------ a scripted MCQ teacher

# Per image, the writer's reply; (question, options, gold) per line. The judge knows the answer
# the references give (REFS_SAY) and guesses one question without any text (the sky's colour).
WRITER_LINES = [
    "Here are your questions:",
    "1 | What flies over the beach? | a kite | a bird | a plane | a balloon | A",
    "2 | What colour is the sky? | blue | green | red | grey | A",
    "3 | How many kites are there? | two | one | three | four | A",
    "4 | What colour is the kite? | red | blue | Not given | green | A",
    "5 | Is there sand? | yes | no | A",
]
REFS_SAY = {
    "What flies over the beach?": "a kite",  # supported: kept
    "What colour is the sky?": "blue",  # ... but guessed from no text: dropped
    "How many kites are there?": "one",  # the writer's gold (two) is wrong: unsupported
    "Is there sand?": "yes",  # kept
}
GUESSED = {"What colour is the sky?": "blue"}
PROSE = "Sure! The image shows a kite over a beach."
_OPTION = re.compile(r"([A-E])\. (.*?)(?= [A-E]\. |$)")


def _picture(text):
    return int(re.search(r"picture (\d+)", text).group(1))


def _judge_reply(text):
    """Answers the G2P prompt (acecap.mcq_prompt): REFS_SAY from the references, GUESSED from none."""
    questions = text.split("\nQuestions:\n", 1)[1].split("\nText:\n", 1)
    blind = questions[1] == gold_mcq.NO_TEXT
    lines = []
    for line in questions[0].splitlines():
        k, item = line.split(" | ", 1)
        question = item[: item.index(" A. ")]
        options = dict((text, letter) for letter, text in _OPTION.findall(item[len(question) :]))
        value = (GUESSED if blind else REFS_SAY).get(question)
        lines.append(f"{k} | {options.get(value, 'E')}")
    return "\n".join(lines)


@contextlib.contextmanager
def mcq_teacher(fail=None):
    """Serves the writer and judge; yields (base URL .../v1, list of (kind, body) received).

    Image 1's writer answers prose on its first ask, image 2's always; the judge's first answer
    from image 3's references names no letter. fail: a dict whose "status" (when set) every
    request gets instead."""
    received, lock = [], threading.Lock()

    async def chat(request):
        body = json.loads(await request.body())
        text = body["messages"][-1]["content"]
        text = text if isinstance(text, str) else "".join(p.get("text", "") for p in text)
        kind = "writer" if text.startswith(gold_mcq.WRITER_INSTRUCTION) else "judge"
        with lock:
            received.append((kind, body))
        if fail and fail.get("status"):
            return JSONResponse({"error": {"message": "scripted failure"}}, fail["status"])
        reask = "seed" in body  # asks after the first sample with a seed
        if kind == "writer":
            k = _picture(text)
            content = PROSE if k == 2 or (k == 1 and not reask) else "\n".join(WRITER_LINES)
        else:
            blind = text.endswith("\nText:\n" + gold_mcq.NO_TEXT)
            unreadable = not blind and not reask and "picture 3" in text
            content = "I think the first one." if unreadable else _judge_reply(text)
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": content}}],
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with app_in_thread(app) as base:
        yield f"{base}/v1", received


def _command(data, out, url, *extra):
    return [
        sys.executable,
        "-m",
        "mocojax.gold_mcq",
        "--input",
        os.path.join(data, "images.jsonl"),
        "--out",
        out,
        "--teacher",
        f"openai:{url}#writer",
        "--judge",
        f"openai:{url}#judge",
        "--min_questions=2",
        "--max_retries=0",
        "--quiet",
        *extra,
    ]


def _run(command, code=0):
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert result.returncode == code, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_gold_mcq_command_writes_verified_items_and_resumes(tmp_path):
    data = str(tmp_path / "data")
    write_images(data, 4)
    out = os.path.join(data, "mcq", "mcq.jsonl")
    fail = {}
    with mcq_teacher(fail) as (url, received):
        result = _run(_command(data, out, url))
        summary = json.load(open(out + ".summary.json"))
        assert summary["images"] == {"written": 3, "dropped": 1}  # image 2: prose at every ask
        # Per written image: 6 reply lines, 2 malformed (prose, a Not-Given option), 1 guessed
        # from no text, 1 whose gold the references contradict, 2 kept.
        assert summary["items"] == {
            "lines": 18,
            "bad_lines": 6,
            "over_limit": 0,
            "unsupported": 3,
            "guessable": 3,
            "unverified": 0,
            "too_few": 0,
            "kept": 6,
        }
        assert summary["parts"]["writer"] == {"asked": 7, "bad": 4, "dropped": 1, "errors": 0}
        assert summary["parts"]["judge_references"] == {
            "asked": 4,
            "bad": 1,
            "dropped": 0,
            "errors": 0,
        }
        assert summary["parts"]["judge_no_text"]["asked"] == 3
        assert "6 kept" in result.stdout and "3 answerable without them" in result.stdout
        # image paths stay relative to the input's folder, which is not OUT's: the note says so
        assert "--config.data.image_root=" in result.stdout

        records, _ = records_lib.load_jsonl(out, image_root=data, strict=True)
        assert [r["id"] for r in records] == ["im0", "im1", "im3"]
        for record in records:
            golds = {i.question: i.options[acecap.LETTERS.index(i.answer)] for i in record["mcq"]}
            assert golds == {"What flies over the beach?": "a kite", "Is there sand?": "yes"}
            assert record["references"][0].startswith("A red kite over a beach")

        # Rerun: every image is done, nothing is sent.
        sent = len(received)
        _run(_command(data, out, url))
        assert len(received) == sent
        # A kill between the ledger line and the record line: the record is restored from the
        # ledger. A kill before the ledger line (its last line torn off): that image is asked
        # again, from the reply cache, and written once.
        lines = open(out).read().splitlines(keepends=True)
        ledger = open(out + ".ledger.jsonl").read().splitlines(keepends=True)
        with open(out, "w") as f:
            f.writelines(lines[:1])
        with open(out + ".ledger.jsonl", "w") as f:
            f.writelines(ledger[:-1] + [ledger[-1][:25]])
        _run(_command(data, out, url))
        assert len(received) == sent
        assert open(out).read().splitlines(keepends=True) == lines
        assert len(open(out + ".ledger.jsonl").read().splitlines()) == len(ledger)

        # Other settings on the same OUT: refused, exit 2.
        result = _run(_command(data, out, url, "--num_questions=5"), code=2)
        assert "was started with other settings (num_questions)" in result.stderr
        result = _run(_command(data, out, url, "--min_questions=9"), code=2)
        assert "min_questions=9 > num_questions=8" in result.stderr
        # An endpoint that stops answering: exit 1, the message names it.
        fail["status"] = 503
        result = _run(_command(data, os.path.join(data, "other.jsonl"), url), code=1)
        assert "HTTP 503" in result.stderr and "rerun the same command to resume" in result.stderr
