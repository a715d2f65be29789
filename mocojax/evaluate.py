"""Scores a model's captions under the evaluation protocols (docs/evaluation.md):

  python -m mocojax.evaluate --config configs/toyworld.py --workdir DIR [--model SPEC] [--against SPEC]
      [--also SPEC,SPEC] [--protocols winrate,rank,vqa,exact] [--judge oracle] [--readers oracle,self]

The scored model defaults to DIR's own checkpoint (rl, else sft); SPECs are a workdir[@stage], an
HF directory or a captions .jsonl (mocojax.eval.suite). Writes DIR/evaluation.json and
DIR/captions_<label>.jsonl, prints one table per protocol. A bad spec is a one-line error (exit 2)
before any caption is generated.
"""

import sys

from absl import app, flags, logging as absl_logging
from ml_collections import config_flags

from mocojax import endpoint
from mocojax.eval import suite

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory (evaluation.json); the default --model."
)
_MODEL = flags.DEFINE_string("model", None, "Scored source spec; default: --workdir.")
_AGAINST = flags.DEFINE_string("against", None, "Baseline source spec (win rate, ranking).")
_ALSO = flags.DEFINE_list("also", [], "More source specs for the blind ranking.")
_PROTOCOLS = flags.DEFINE_string("protocols", ",".join(suite.PROTOCOLS), "Comma list of protocols.")
_JUDGE = flags.DEFINE_string(
    "judge", "oracle", "Pairwise / ranking judge: oracle, self, a model spec, openai:URL#MODEL."
)
_READERS = flags.DEFINE_list("readers", ["oracle"], "Caption-VQA readers (same forms as --judge).")
_NUM_IMAGES = flags.DEFINE_integer(
    "num_images", None, "Held-out images; default config.eval.num_scenes."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the position shuffles and the bootstrap.")


def main(argv):
    absl_logging.set_verbosity(absl_logging.WARNING)
    # Checkpoints are opened read only on purpose (as mocojax.main's eval does): drop orbax's notice.
    absl_logging.get_absl_logger().addFilter(
        lambda record: "Given directory is read only" not in record.getMessage()
    )
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    try:
        protocols = suite.parse_list(_PROTOCOLS.value, suite.PROTOCOLS)
        result = suite.run(
            _CONFIG.value,
            _WORKDIR.value,
            model_spec=_MODEL.value or _WORKDIR.value,
            against_spec=_AGAINST.value,
            also_specs=_ALSO.value,
            protocols=protocols,
            judge_spec=_JUDGE.value,
            reader_specs=_READERS.value,
            num_images=_NUM_IMAGES.value,
            seed=_SEED.value,
        )
    except (suite.SpecError, NotImplementedError) as e:
        print(f"mocojax.evaluate: {e}", file=sys.stderr)
        sys.exit(2)
    except endpoint.EndpointError as e:  # an openai: judge that did not answer (retries spent)
        print(f"mocojax.evaluate: {e}", file=sys.stderr)
        sys.exit(1)
    print(suite.format_table(result), flush=True)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
