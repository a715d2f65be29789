"""Writes the rollout report of an RL run (docs/evaluation.md):

  python -m mocojax.report --workdir DIR [--out PAGE.html] [--tensorboard_dir TB] [--max_groups N]

One self-contained HTML page (default DIR/rollout_report.html) of DIR/rl_samples.jsonl's groups with
plots of DIR/metrics.jsonl, and the same samples as TensorBoard summaries (default DIR/tb/rollouts;
--tensorboard_dir='' skips them). User-data images are found through --records (a JSONL with
"id" and "image"; relative paths against --image_root). Toy images are re-rendered from their id.
"""

import json
import os
import sys

from absl import app, flags

from mocojax.eval import report

_WORKDIR = flags.DEFINE_string("workdir", None, "RL workdir (rl_samples.jsonl, metrics.jsonl).")
_OUT = flags.DEFINE_string("out", None, "Page to write; default <workdir>/rollout_report.html.")
_TB = flags.DEFINE_string(
    "tensorboard_dir", None, "TensorBoard log dir; default <workdir>/tb/rollouts; '' skips."
)
_MAX_GROUPS = flags.DEFINE_integer("max_groups", 0, "Report the first N logged groups (0: all).")
_RECORDS = flags.DEFINE_string("records", "", "JSONL of {id, image} for user-data images.")
_IMAGE_ROOT = flags.DEFINE_string(
    "image_root", "", "Folder that relative --records image paths are under."
)


def _images(path, root):
    if not path:
        return {}
    rows, _ = report.read_jsonl(path)
    return {
        str(r["id"]): os.path.join(root, r["image"])
        for r in rows
        if isinstance(r.get("image"), str) and "id" in r
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    workdir = _WORKDIR.value
    out = _OUT.value or os.path.join(workdir, "rollout_report.html")
    tb_dir = os.path.join(workdir, "tb", "rollouts") if _TB.value is None else _TB.value
    try:
        images = _images(_RECORDS.value, _IMAGE_ROOT.value)
        page, counts = report.build_html(workdir, images=images, max_groups=_MAX_GROUPS.value)
    except (report.ReportError, OSError) as e:
        print(f"mocojax.report: {e}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    if tb_dir:
        report.write_tensorboard(workdir, tb_dir, images=images, max_groups=_MAX_GROUPS.value)
    print(
        f"wrote {out}: {json.dumps(counts)}"
        + (f"; TensorBoard summaries in {tb_dir}" if tb_dir else "")
    )


if __name__ == "__main__":
    app.run(main)
