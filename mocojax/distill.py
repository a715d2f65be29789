"""Writes the role SFT set through teacher endpoints (docs/distill.md):

  python -m mocojax.distill --input images.jsonl --out sft.jsonl --teacher openai:URL#MODEL \\
      --student openai:URL#MODEL_OR_CHECKPOINT [--generator_teacher SPEC] [--judge_teacher SPEC] \\
      [--rubric_mode committee --committee SPEC,SPEC,SPEC]

A teacher or student SPEC is `openai:http(s)://host:port/v1#MODEL` (any OpenAI-compatible endpoint;
the key from $OPENAI_API_KEY when set) or a local mocojax checkpoint (an HF directory or a
workdir[@stage]), run in-process. Rerunning the same command resumes a killed run. Prints the
counts of asks, bad replies and drops per part; exit 1 when an endpoint stops answering, 2 on bad
flags or a mismatched output.
"""

from absl import app, flags, logging as absl_logging

from mocojax.data import distill

_COMMON = distill.define_command_flags()

_TEACHER = flags.DEFINE_string("teacher", None, "Teacher spec for every part without its own.")
_POLICY = flags.DEFINE_string(
    "policy_teacher", None, "Policy captions (and one-teacher committee) spec."
)
_GENERATOR = flags.DEFINE_string(
    "generator_teacher", None, "Rubric writer spec (also the consensus writer)."
)
_JUDGE = flags.DEFINE_string("judge_teacher", None, "Judge spec.")
_STUDENT = flags.DEFINE_string(
    "student",
    None,
    "Candidate captions: a checkpoint or endpoint spec "
    "(not needed when every record has candidates).",
)
_COMMITTEE = flags.DEFINE_list(
    "committee",
    [],
    "rubric_mode=committee: one spec per committee member "
    "(default: the policy teacher sampled --committee_size times).",
)

_DEFAULTS = distill.Options()
_OPTION_FLAGS = {
    "num_policy": flags.DEFINE_integer(
        "num_policy", _DEFAULTS.num_policy, "Teacher captions per image."
    ),
    "keep_references": flags.DEFINE_boolean(
        "keep_references", _DEFAULTS.keep_references, "Also train the Policy on the references."
    ),
    "num_candidates": flags.DEFINE_integer(
        "num_candidates", _DEFAULTS.num_candidates, "M student captions per image."
    ),
    "num_judged": flags.DEFINE_integer(
        "num_judged", _DEFAULTS.num_judged, "Candidates judged per image (0: all)."
    ),
    "max_asks": flags.DEFINE_integer(
        "max_asks", _DEFAULTS.max_asks, "Asks per output in all (1 + re-asks)."
    ),
    "policy_max_tokens": flags.DEFINE_integer(
        "policy_max_tokens", _DEFAULTS.policy_max_tokens, "Caption length."
    ),
    "candidate_max_tokens": flags.DEFINE_integer(
        "candidate_max_tokens", _DEFAULTS.candidate_max_tokens, "Student caption length."
    ),
    "rubric_max_tokens": flags.DEFINE_integer(
        "rubric_max_tokens", _DEFAULTS.rubric_max_tokens, "Rubric length."
    ),
    "judge_max_tokens": flags.DEFINE_integer(
        "judge_max_tokens", _DEFAULTS.judge_max_tokens, "Decisions length."
    ),
    "temperature": flags.DEFINE_float(
        "temperature", _DEFAULTS.temperature, "A teacher's first ask."
    ),
    "sample_temperature": flags.DEFINE_float(
        "sample_temperature",
        _DEFAULTS.sample_temperature,
        "Re-asks, extra captions, one-teacher committee.",
    ),
    "student_temperature": flags.DEFINE_float(
        "student_temperature", _DEFAULTS.student_temperature, "Student sampling temperature."
    ),
    "keep_truncated": flags.DEFINE_boolean(
        "keep_truncated", _DEFAULTS.keep_truncated, "Keep teacher captions cut at max_tokens."
    ),
    "rubric_mode": flags.DEFINE_enum(
        "rubric_mode",
        _DEFAULTS.rubric_mode,
        list(distill.RUBRIC_MODES),
        "generator: one rubric writer; committee: RubiCap's consensus rubric.",
    ),
    "committee_size": flags.DEFINE_integer(
        "committee_size", _DEFAULTS.committee_size, "K captions when the committee is one teacher."
    ),
    "max_rubric_items": flags.DEFINE_integer(
        "max_rubric_items", _DEFAULTS.max_rubric_items, "Rubric items kept."
    ),
    "seed": flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of sampled requests."),
    "chunk_size": flags.DEFINE_integer(
        "chunk_size", _DEFAULTS.chunk_size, "Images in flight together."
    ),
    "image_max_pixels": flags.DEFINE_integer(
        "image_max_pixels",
        _DEFAULTS.image_max_pixels,
        "Images with more pixels are sent downscaled.",
    ),
}


def main(argv):
    """Runs the distillation the flags ask for and prints its summary (exit codes: the module
    docstring; distill.CommandSession maps each failure to its code and closes the clients)."""
    absl_logging.set_verbosity(absl_logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _TEACHER.value and not (_POLICY.value and _GENERATOR.value and _JUDGE.value):
        raise app.UsageError(
            "--teacher is required (or all of --policy_teacher, --generator_teacher, --judge_teacher)"
        )
    options = distill.Options(**{k: f.value for k, f in _OPTION_FLAGS.items()})
    specs = {
        "policy": _POLICY.value or _TEACHER.value,
        "generator": _GENERATOR.value or _TEACHER.value,
        "judge": _JUDGE.value or _TEACHER.value,
        "student": _STUDENT.value,
    }
    with distill.session("mocojax.distill", _COMMON) as session:
        options.check()
        records, image_root = distill.load_command_images(session, _COMMON)
        client = session.client
        teachers = distill.Teachers(
            policy=client(specs["policy"]),
            generator=client(specs["generator"]),
            judge=client(specs["judge"]),
            student=client(specs["student"]) if specs["student"] else None,
            committee=[client(s) for s in _COMMITTEE.value],
            names={**specs, "committee": list(_COMMITTEE.value)},
        )
        summary = distill.run(
            records,
            teachers,
            options,
            _COMMON["out"].value,
            image_root,
            source=f"{_COMMON['source'].value}:{_COMMON['input'].value}",
            progress=not _COMMON["quiet"].value,
        )
    print(distill.format_summary(summary), flush=True)
    if "note" in summary:
        print(summary["note"], flush=True)


if __name__ == "__main__":
    flags.mark_flags_as_required(["input", "out"])
    app.run(main)
