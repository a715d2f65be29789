"""The rollout report (mocojax.eval.report, python -m mocojax.report): the page's content from a
hand-written rl_samples.jsonl, the SVG plot's coordinates, TensorBoard summaries, bad input, and
the page rendered by headless Chromium (Debian's `chromium`; skipped where it is not installed)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mocojax.eval import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _rows(image_path):
    toy = {
        "step": 5,
        "image_id": "toy1-000494",
        "captions": ["LOW caption", "HIGH caption", "", "MID caption"],
        "rewards": [0.1, 0.9, 0.0, 0.5],
        "rubric": [
            {"criterion": "mentions a red circle", "check": "named", "weight": 3.0},
            {"criterion": "gibberish", "check": "", "weight": 1.0},
        ],
        "decisions": [[0, 1], [1, 1], [0, 0], [1, 0]],
        "has_signal": True,
        "generator_problems": ["x"],
        "truth": {
            "f1": [0.25, 0.75, 0.0, 0.5],
            "hallucinated": [1, 0, 0, 0],
            "item_true": [True, None],
            "decision_right": [[1, None], [0, None], [1, None], [1, None]],
        },
    }
    user = {
        "step": 6,
        "image_id": "photo-1",
        "captions": ["a photo"],
        "rewards": [0.0],
        "rubric": [],
        "decisions": [[]],
        "has_signal": False,
        "image": image_path,
    }
    return [toy, user, {"step": 7, "captions": ["no image id"], "rewards": [0.0]}]


@pytest.fixture()
def workdir(tmp_path):
    image_path = str(tmp_path / "photo.png")
    Image.new("RGB", (40, 30), (200, 20, 20)).save(image_path)
    with open(tmp_path / "rl_samples.jsonl", "w") as f:
        for row in _rows(image_path):
            f.write(json.dumps(row) + "\n")
        f.write("{half a row\n")
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step, reward in ((1, 0.2), (2, 0.4), (3, float("nan"))):
            f.write(
                json.dumps(
                    {
                        "stage": "rl",
                        "step": step,
                        "reward_mean": reward if reward == reward else None,
                        "tracking_error": step / 10,
                    }
                )
                + "\n"
            )
        f.write(json.dumps({"stage": "sft", "step": 1, "reward_mean": 9.0}) + "\n")
    return tmp_path


def test_page_shows_each_group_sorted_by_reward_with_truth_marks(workdir):
    page, counts = report.build_html(str(workdir), images={"photo-1": str(workdir / "photo.png")})
    assert counts == {"groups": 2, "skipped_rows": 2, "images_missing": 0}
    first = page[page.index('id="group-0"') : page.index('id="group-1"')]
    assert (
        first.index("HIGH caption")
        < first.index("MID caption")
        < first.index("LOW caption")
        < first.index("(empty caption)")
    )
    assert first.count('class="d right"') == 3 and first.count('class="d wrong"') == 1
    assert first.count('class="d unknown"') == 4
    assert '<tr class="true"><td>1</td><td>mentions a red circle' in first
    assert '<tr class="unreadable"><td>2</td><td>gibberish' in first
    assert (
        "<td>0.900</td><td>0.750</td><td>0</td>" in first
    )  # reward, true F1, hallucinated objects
    assert page.count("data:image/png;base64,") == 2
    assert "signal: no (all rewards equal)" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # self-contained


def test_toy_image_is_the_rendered_scene(workdir):
    image, note = report.group_image("toy1-000494", {})
    from mocojax.data import toyworld as tw

    want = tw.render(tw.make_scene(1, 494), 128)
    assert note == "" and np.array_equal(np.asarray(image), np.asarray(want))
    image, note = report.group_image("photo-2", {})
    assert image is None and "--records" in note
    image, note = report.group_image("photo-3", {"photo-3": str(workdir / "nope.png")})
    assert image is None and "not readable" in note


def test_svg_plot_coordinates_and_curves(workdir):
    svg = report.svg_plot("r", [(1, 0.0), (3, 1.0)])
    assert (
        'points="42.0,146.0 292.0,22.0"' in svg
    )  # min at the bottom-left corner, max at the top-right
    assert "no data" in report.svg_plot("r", [])
    curves = report.load_curves(str(workdir))
    assert curves["reward_mean"] == [
        (1, 0.2),
        (2, 0.4),
    ]  # the null step and the sft row are left out
    assert curves["tracking_error"] == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_command_writes_page_and_tensorboard_and_refuses_a_workdir_without_samples(
    workdir, tmp_path_factory
):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = workdir / "page" / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "mocojax.report", "--workdir", str(workdir), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file() and '"groups": 2' in done.stdout
    events = os.listdir(workdir / "tb" / "rollouts")
    assert len(events) == 1 and os.path.getsize(workdir / "tb" / "rollouts" / events[0]) > 1000
    empty = tmp_path_factory.mktemp("empty")
    failed = subprocess.run(
        [sys.executable, "-m", "mocojax.report", "--workdir", str(empty)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert (
        failed.stderr.strip().startswith("mocojax.report: ")
        and "rl_samples.jsonl: no such file" in failed.stderr
    )


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)",
)
def test_page_renders_in_headless_chromium(workdir, tmp_path):
    page, _ = report.build_html(str(workdir), images={"photo-1": str(workdir / "photo.png")})
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        base + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=90
    )
    assert 'data-images-ok="2/2"' in dom.stdout  # the inline script ran and both PNGs decoded
    shot = tmp_path / "shot.png"
    subprocess.run(
        base + ["--window-size=1000,700", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        timeout=90,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (700, 1000, 3)
    # The first group's toy scene is on screen: its gray background and the red of its circle.
    assert (np.abs(pixels.astype(int) - (150, 150, 150)).sum(-1) == 0).sum() > 2000
    assert (np.abs(pixels.astype(int) - (215, 40, 40)).sum(-1) < 30).sum() > 50
