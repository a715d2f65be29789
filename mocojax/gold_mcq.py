"""Writes the Gold-MCQs of real images through a teacher endpoint (docs/acecap.md):

  python -m mocojax.gold_mcq --input images.jsonl --out mcq.jsonl --teacher openai:URL#MODEL \\
      [--judge openai:URL#MODEL] [--num_questions 8] [--noverify]

The writer (--teacher) reads each image's references and writes its questions; the judge (--judge,
default the teacher) keeps only those it answers right from the references and not from no text
(mocojax/data/gold_mcq.py). A SPEC is `openai:http(s)://host:port/v1#MODEL` (the key from
$OPENAI_API_KEY when set) or a local mocojax checkpoint (an HF directory or a workdir[@stage]).
OUT holds the written image records with an `mcq` field (train with --config.rl.reward=g2p and a
model judge). Rerunning the same command resumes a killed run. Prints the counts of items kept and
dropped per reason; exit 1 when an endpoint stops answering, 2 on bad flags or a mismatched output.
"""

from absl import app, flags, logging as absl_logging

from mocojax.data import distill, gold_mcq

_COMMON = distill.define_command_flags()

_TEACHER = flags.DEFINE_string("teacher", None, "The question writer's spec.")
_JUDGE = flags.DEFINE_string("judge", None, "The verifying judge's spec (default: the teacher).")

_DEFAULTS = gold_mcq.Options()
_OPTION_FLAGS = {
    "num_questions": flags.DEFINE_integer(
        "num_questions", _DEFAULTS.num_questions, "Questions asked per image (at most kept)."
    ),
    "min_questions": flags.DEFINE_integer(
        "min_questions", _DEFAULTS.min_questions, "Fewer kept items: the image is dropped."
    ),
    "max_asks": flags.DEFINE_integer(
        "max_asks", _DEFAULTS.max_asks, "Asks per output in all (1 + re-asks)."
    ),
    "writer_max_tokens": flags.DEFINE_integer(
        "writer_max_tokens", _DEFAULTS.writer_max_tokens, "The writer's reply length."
    ),
    "judge_max_tokens": flags.DEFINE_integer(
        "judge_max_tokens", _DEFAULTS.judge_max_tokens, "The judge's reply length."
    ),
    "temperature": flags.DEFINE_float(
        "temperature", _DEFAULTS.temperature, "The writer's first ask."
    ),
    "sample_temperature": flags.DEFINE_float(
        "sample_temperature", _DEFAULTS.sample_temperature, "Re-asks."
    ),
    "seed": flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of re-asks and option shuffles."),
    "verify": flags.DEFINE_boolean(
        "verify", _DEFAULTS.verify, "Keep only items the judge answers from the references alone."
    ),
    "shuffle_options": flags.DEFINE_boolean(
        "shuffle_options", _DEFAULTS.shuffle_options, "Spread the gold letter over the options."
    ),
    "chunk_size": flags.DEFINE_integer(
        "chunk_size", _DEFAULTS.chunk_size, "Images in flight together."
    ),
}


def main(argv):
    """Runs the Gold-MCQ writing the flags ask for and prints its summary (exit codes: the module
    docstring)."""
    absl_logging.set_verbosity(absl_logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    options = gold_mcq.Options(**{k: f.value for k, f in _OPTION_FLAGS.items()})
    names = {"writer": _TEACHER.value, "judge": _JUDGE.value or _TEACHER.value}
    with distill.session("mocojax.gold_mcq", _COMMON) as session:
        options.check()
        records, image_root = distill.load_command_images(session, _COMMON)
        summary = gold_mcq.run(
            records,
            session.client(names["writer"]),
            session.client(names["judge"]),
            options,
            _COMMON["out"].value,
            image_root,
            names=names,
            source=f"{_COMMON['source'].value}:{_COMMON['input'].value}",
            progress=not _COMMON["quiet"].value,
        )
    print(gold_mcq.format_summary(summary), flush=True)
    if "note" in summary:
        print(summary["note"], flush=True)


if __name__ == "__main__":
    flags.mark_flags_as_required(["input", "out", "teacher"])
    app.run(main)
