"""The rollout report: one self-contained HTML page of an RL run's logged groups, and the same
samples as TensorBoard image / text summaries.

Per logged group (<workdir>/rl_samples.jsonl): the image (inlined PNG; toy images re-rendered
from the scene id, user images read from their path), the N captions sorted by reward with the
exact F1 where known, the rubric (criterion, check, weight, truth) and every Judge decision,
marked right / wrong against the toy world's truth. Above them, inline-SVG plots vs step of
<workdir>/metrics.jsonl's RL scalars. No external file, script or font: the page opens anywhere.
"""

import base64
import html
import io
import json
import math
import os
import re

import numpy as np

from mocojax.data import toyworld as tw

PLOTS = (
    ("reward_mean", "mean rubric reward"),
    ("true/caption_f1", "true caption F1"),
    ("zero_variance_frac", "zero-variance group fraction"),
    ("true/reward_f1_corr_within", "within-group r(reward, F1)"),
    ("tracking_error", "tracking error"),
)
_TOY_ID = re.compile(r"^toy(\d+)-(\d+)$")
_REQUIRED = ("step", "image_id", "captions", "rewards")


class ReportError(ValueError):
    """A workdir without what the report reads (the CLI prints it, exit 2)."""


def read_jsonl(path):
    """Returns (rows that are JSON objects, number of lines skipped)."""
    rows, skipped = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                skipped += 1
    return rows, skipped


def load_samples(workdir):
    """Returns (usable rl_samples.jsonl rows, number skipped: not JSON or missing a field)."""
    path = os.path.join(workdir, "rl_samples.jsonl")
    if not os.path.isfile(path):
        raise ReportError(
            f"{path}: no such file (an RL run writes it; config.rl.sample_every controls it)"
        )
    rows, skipped = read_jsonl(path)
    good = [
        r
        for r in rows
        if all(k in r for k in _REQUIRED) and len(r["captions"]) == len(r["rewards"])
    ]
    return good, skipped + len(rows) - len(good)


def load_curves(workdir):
    """Returns {metric: [(step, value)]} of the RL stage's scalars in metrics.jsonl ({} without it)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return {}
    curves = {key: [] for key, _ in PLOTS}
    for row in read_jsonl(path)[0]:
        if row.get("stage") != "rl":
            continue
        for key in curves:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                curves[key].append((row.get("step", 0), float(value)))
    return curves


def group_image(image_id, images, size=128):
    """Returns (PIL image or None, note): a toy scene re-rendered from its id, else images[id]'s file."""
    match = _TOY_ID.match(str(image_id))
    if match:
        scene = tw.make_scene(int(match.group(1)), int(match.group(2)))
        return tw.render(scene, size), ""
    path = images.get(image_id)
    if not path:
        return None, "no image path for this id (pass --records)"
    from mocojax import processing

    try:
        image = processing.load_image(path)
    except (OSError, ValueError) as e:
        return None, f"image not readable: {e}"
    image.thumbnail((256, 256))
    return image, ""


def png_base64(image):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def svg_plot(title, points, width=300, height=170):
    """Returns an inline SVG line plot of [(step, value)] with its range labelled."""
    pad_l, pad_r, pad_t, pad_b = 42, 8, 22, 24
    esc = html.escape(title)
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{esc}">'
    frame = f'<text x="{width / 2}" y="14" text-anchor="middle" font-size="12">{esc}</text>'
    if not points:
        return f'{head}{frame}<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="11">no data</text></svg>'
    steps = np.array([p[0] for p in points], float)
    values = np.array([p[1] for p in points], float)
    x0, x1 = steps.min(), max(steps.max(), steps.min() + 1)
    y0, y1 = values.min(), values.max()
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    px = pad_l + (steps - x0) / (x1 - x0) * (width - pad_l - pad_r)
    py = pad_t + (y1 - values) / (y1 - y0) * (height - pad_t - pad_b)
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(px, py))
    bottom, right = height - pad_b, width - pad_r
    return (
        f'{head}{frame}<rect x="{pad_l}" y="{pad_t}" width="{right - pad_l}" height="{bottom - pad_t}" '
        f'fill="none" stroke="#bbb"/><polyline points="{line}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>'
        f'<text x="{pad_l - 3}" y="{pad_t + 9}" text-anchor="end" font-size="10">{y1:.3g}</text>'
        f'<text x="{pad_l - 3}" y="{bottom}" text-anchor="end" font-size="10">{y0:.3g}</text>'
        f'<text x="{pad_l}" y="{height - 8}" font-size="10">step {x0:g}</text>'
        f'<text x="{right}" y="{height - 8}" text-anchor="end" font-size="10">{x1:g}</text></svg>'
    )


def _fmt(value, spec=".3f"):
    return "–" if value is None else format(value, spec)


def _truth_word(value):
    return {True: "true", False: "false"}.get(value, "unreadable")


def _decision_cell(value, right):
    """Returns a decision's cell: its 0/1 and a right / wrong mark (right is 1/0/True/False or None)."""
    mark = "unknown" if right is None else ("right" if right else "wrong")
    symbol = {"right": "✓", "wrong": "✗", "unknown": ""}[mark]
    return f'<td class="d {mark}" title="Judge said {html.escape(str(value))}; {mark}">{html.escape(str(value))}{symbol}</td>'


def group_html(index, row, images):
    """Returns the <section> of one logged group."""
    truth = row.get("truth") or {}
    n = len(row["captions"])
    f1 = truth.get("f1") or [None] * n
    halluc = truth.get("hallucinated") or [None] * n
    decisions = row.get("decisions") or [[] for _ in range(n)]
    right = truth.get("decision_right") or [[None] * len(d) for d in decisions]
    rubric = row.get("rubric") or []
    item_true = truth.get("item_true") or [None] * len(rubric)
    image, note = group_image(row["image_id"], images)
    picture = (
        f'<img src="data:image/png;base64,{png_base64(image)}" width="{image.width}" height="{image.height}" '
        f'alt="{html.escape(str(row["image_id"]))}">'
        if image
        else f'<div class="noimg">{html.escape(note)}</div>'
    )
    order = sorted(range(n), key=lambda k: -row["rewards"][k])
    head = "".join(f"<th>{k}</th>" for k in range(1, len(rubric) + 1))
    lines = []
    for k in order:
        caption = row["captions"][k]
        cells = "".join(
            _decision_cell(v, r)
            for v, r in zip(
                decisions[k] if k < len(decisions) else [], right[k] if k < len(right) else []
            )
        )
        lines.append(
            f"<tr><td>{_fmt(row['rewards'][k])}</td><td>{_fmt(f1[k])}</td><td>{_fmt(halluc[k], 'd')}</td>"
            f'<td class="cap">{html.escape(caption) if caption.strip() else "<i>(empty caption)</i>"}</td>'
            f"{cells}</tr>"
        )
    items = "".join(
        f'<tr class="{_truth_word(t)}"><td>{k}</td><td>{html.escape(str(i.get("criterion", "")))}</td>'
        f"<td>{html.escape(str(i.get('check', '')))}</td><td>{_fmt(i.get('weight'), 'g')}</td>"
        f"<td>{_truth_word(t)}</td></tr>"
        for k, (i, t) in enumerate(zip(rubric, item_true), 1)
    )
    problems = row.get("generator_problems") or []
    signal = "yes" if row.get("has_signal") else "no (all rewards equal)"
    return (
        f'<section class="group" id="group-{index}"><h2>group {index + 1} · step {row["step"]} · '
        f'{html.escape(str(row["image_id"]))} · signal: {signal}</h2><div class="row">{picture}'
        f'<div><table class="caps"><tr><th>reward</th><th>true F1</th><th>halluc.</th><th>caption (by reward)</th>'
        f"{head}</tr>{''.join(lines)}</table>"
        f'<table class="rubric"><tr><th>#</th><th>criterion</th><th>check</th><th>weight</th><th>truth</th></tr>'
        f"{items or '<tr><td colspan=5><i>no rubric items parsed</i></td></tr>'}</table>"
        f'<p class="small">{len(problems)} generator parse problems</p></div></div></section>'
    )


_STYLE = """body{font-family:sans-serif;margin:16px;color:#222}h1{font-size:20px}h2{font-size:15px;margin:4px 0}
.plots{display:flex;flex-wrap:wrap;gap:8px}.group{border-top:2px solid #ccc;padding:8px 0}
.row{display:flex;gap:12px;align-items:flex-start}table{border-collapse:collapse;font-size:12px;margin-bottom:6px}
td,th{border:1px solid #ddd;padding:2px 5px;vertical-align:top}.cap{max-width:560px}
.d.right{background:#d8f0d8}.d.wrong{background:#f6d0d0}.d.unknown{background:#eee}
tr.true td:last-child{color:#17702a}tr.false td:last-child{color:#b02020}tr.unreadable td:last-child{color:#888}
.small{font-size:11px;color:#666}.noimg{width:128px;height:128px;background:#eee;font-size:11px}"""
# Sets body[data-images-ok] to "decoded/total" once loaded: the headless render test reads it.
_SCRIPT = (
    "<script>window.addEventListener('load',function(){var a=Array.prototype.slice.call(document.images);"
    "document.body.setAttribute('data-images-ok',a.filter(function(i){return i.complete&&i.naturalWidth>0})"
    ".length+'/'+a.length)})</script>"
)


def build_html(workdir, *, images=None, max_groups=0):
    """Returns (the report page, {"groups", "skipped_rows", "images_missing"})."""
    rows, skipped = load_samples(workdir)
    rows = rows[:max_groups] if max_groups else rows
    curves = load_curves(workdir)
    plots = "".join(svg_plot(title, curves.get(key, [])) for key, title in PLOTS)
    sections = [group_html(k, row, images or {}) for k, row in enumerate(rows)]
    missing = sum('class="noimg"' in s for s in sections)
    title = f"rollout report: {html.escape(os.path.abspath(workdir))}"
    page = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style></head>'
        f"<body><h1>{title}</h1><p class='small'>{len(rows)} logged groups; {skipped} unreadable rows skipped; "
        "decisions: green right, red wrong, grey unknown (no toy-world truth)</p>"
        f'<div class="plots">{plots}</div>{"".join(sections)}{_SCRIPT}</body></html>'
    )
    return page, {"groups": len(rows), "skipped_rows": skipped, "images_missing": missing}


def write_tensorboard(workdir, log_dir, *, images=None, max_groups=0):
    """Writes each logged group as a TensorBoard image and a markdown text summary at its step."""
    from tensorboardX import SummaryWriter

    rows, _ = load_samples(workdir)
    rows = rows[:max_groups] if max_groups else rows
    per_step = {}
    with SummaryWriter(log_dir) as writer:
        for row in rows:
            slot = per_step.setdefault(row["step"], 0)
            per_step[row["step"]] += 1
            image, _ = group_image(row["image_id"], images or {})
            if image is not None:
                writer.add_image(
                    f"rollouts/group{slot}",
                    np.asarray(image.convert("RGB")),
                    row["step"],
                    dataformats="HWC",
                )
            f1 = (row.get("truth") or {}).get("f1") or [None] * len(row["captions"])
            lines = ["| reward | true F1 | caption |", "|---|---|---|"]
            lines += [
                f"| {row['rewards'][k]:.3f} | {_fmt(f1[k])} | {row['captions'][k].replace('|', '/')} |"
                for k in sorted(range(len(row["captions"])), key=lambda k: -row["rewards"][k])
            ]
            lines += [
                "",
                "rubric: "
                + "; ".join(
                    f"{i.get('criterion')} (w {i.get('weight')})" for i in row.get("rubric") or []
                ),
            ]
            writer.add_text(
                f"rollouts/group{slot}",
                f"**{row['image_id']}**\n\n" + "\n".join(lines),
                row["step"],
            )
    return len(rows)
