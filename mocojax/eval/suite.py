"""`python -m mocojax.evaluate`'s library: caption sources, judges from flags, the protocols, the table.

A caption source is named by a spec:
  DIR or DIR@STAGE   a workdir's checkpoint (STAGE "rl" or "sft"; default: rl if it has one, else sft)
  HF_DIR             an exported HF directory (config.json + *.safetensors + tokenizer files)
  FILE.jsonl         captions already written: rows {"id", "caption"} (evaluate writes these for every
                     model it captions, so a baseline is captioned once)
  toy:reference      the toy world's reference caption of each scene (the ceiling)
  toy:blind          the next held-out scene's reference caption (image-blind: the floor)
A judge / reader spec is "oracle" (the toy world's exact scorer), "self" (the scored model in
the judge / reader role), any model spec above, or "openai:URL#MODEL" (a remote OpenAI-compatible
endpoint through mocojax.endpoint, its replies cached under <workdir>/endpoint_cache). Every spec is checked before any caption is generated, so a missing
checkpoint is a one-line error, not a traceback after minutes of work.
"""

import json
import math
import os
import re

import numpy as np

from mocojax import checkpoint, config_utils, hf, processing, roles
from mocojax.data import toyroles, toyworld as tw
from mocojax.eval import judges, rank, vqa, winrate

PROTOCOLS = ("winrate", "rank", "vqa", "exact")
# Toy-world reference points, as sources: a reference caption of the scene (the ceiling) and the
# next held-out scene's reference (an image-blind caption, toyworld_eval's baseline).
TOY_BASELINES = ("toy:reference", "toy:blind")


class SpecError(ValueError):
    """A caption source, judge or reader spec that names nothing usable (the CLI prints it, exit 2)."""


def _label(spec):
    path, _, stage = spec.partition("@")
    name = os.path.basename(os.path.normpath(path)).removesuffix(".jsonl") or "model"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}_{stage}" if stage else name)


def _is_hf_dir(path):
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        f.endswith(".safetensors") for f in os.listdir(path)
    )


def resolve(spec):
    """Returns {"kind": "captions"|"toy"|"workdir"|"hf", "path", "stage", "label"} for a source spec, or
    raises SpecError naming what is missing."""
    if spec in TOY_BASELINES:
        return {"kind": "toy", "path": spec, "stage": None, "label": spec.replace(":", "_")}
    path, _, stage = spec.partition("@")
    if path.endswith(".jsonl"):
        if not os.path.isfile(path):
            raise SpecError(f"{spec}: no such captions file")
        return {"kind": "captions", "path": path, "stage": None, "label": _label(spec)}
    if not os.path.isdir(path):
        raise SpecError(
            f"{spec}: no such directory (want a workdir, an HF directory or a captions .jsonl)"
        )
    if os.path.isdir(os.path.join(path, "checkpoints")):
        stages = [s for s in ("rl", "sft") if checkpoint.latest_step(path, s) is not None]
        if stage and stage not in stages:
            raise SpecError(
                f"{spec}: no finished {stage} checkpoint under {checkpoint.stage_dir(path, stage)}"
            )
        if not stages:
            raise SpecError(
                f"{spec}: no finished rl or sft checkpoint under {os.path.join(path, 'checkpoints')}"
            )
        stage = stage or stages[0]
        return {"kind": "workdir", "path": path, "stage": stage, "label": _label(f"{path}@{stage}")}
    if _is_hf_dir(path):
        return {"kind": "hf", "path": path, "stage": None, "label": _label(spec)}
    raise SpecError(
        f"{spec}: neither a workdir with checkpoints/ nor an HF directory (config.json + *.safetensors)"
    )


def held_out_records(config, num_images):
    """Returns the held-out image records: toy scenes after the training ones, or data.eval_path's rows."""
    data = config.data
    if data.source == "toyworld":
        return toyroles.image_records(data.seed, num_images, start=data.num_train_scenes)
    if not data.eval_path:
        raise SpecError("config.data.eval_path is empty: evaluate scores held-out images")
    return config_utils.user_records(config, data.eval_path)[:num_images]


def load_generator(source, config, out_dir, setup_cache):
    """Returns a judges.CheckpointGenerator for a workdir or HF source."""
    ev = config.eval
    size = config.data.image_size
    if source["kind"] == "workdir":
        if "setup" not in setup_cache:  # the tokenizer of a fresh toy model is built into out_dir
            setup_cache["setup"] = config_utils.build_setup(config, out_dir)
        setup = setup_cache["setup"]
        params, step = checkpoint.restore_params(
            source["path"], source["stage"], setup.model_config
        )
        source["step"] = step
        cfg, processor = setup.model_config, setup.processor
    else:
        cfg, params = hf.load_pretrained(source["path"], dtype=config.model.param_dtype)
        processor = processing.Processor(
            processing.load_tokenizer(source["path"]),
            min_pixels=config.data.min_pixels,
            max_pixels=config.data.max_pixels,
        )
    return judges.CheckpointGenerator(
        source["label"],
        cfg,
        params,
        processor,
        batch_size=ev.batch_size,
        max_new_tokens=ev.max_new_tokens,
        image_size=size,
    )


def read_captions(path, records):
    """Returns captions aligned with records from a {"id", "caption"} JSONL (None where an image has
    none; rows that are not such objects are skipped), and the number of rows skipped."""
    by_id, bad = {}, 0
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
                by_id.setdefault(
                    str(row["id"]), row["caption"] if isinstance(row["caption"], str) else None
                )
            except (json.JSONDecodeError, KeyError, TypeError):
                bad += 1
    return [by_id.get(str(r["id"])) for r in records], bad


def write_captions(path, records, captions):
    """Writes {"id", "caption"} rows (the format read_captions and --against read)."""
    with open(path, "w") as f:
        for record, caption in zip(records, captions):
            f.write(json.dumps({"id": record["id"], "caption": caption}) + "\n")


def captions_of(source, records, config, out_dir, setup_cache):
    """Returns (captions aligned with records, generator or None): read, or greedily generated
    by the Policy (written to <out_dir>/captions_<label>.jsonl)."""
    if source["kind"] == "captions":
        captions, bad = read_captions(source["path"], records)
        source["bad_rows"] = bad
        return captions, None
    if source["kind"] == "toy":
        if config.data.source != "toyworld":
            raise SpecError(f"{source['path']}: toy baselines need config.data.source='toyworld'")
        shift = 1 if source["path"] == "toy:blind" else 0
        return [
            tw.reference_captions(records[(k + shift) % len(records)]["scene"], config.data.seed)[0]
            for k in range(len(records))
        ], None
    generator = load_generator(source, config, out_dir, setup_cache)
    captions = generator.complete(
        [roles.POLICY_INSTRUCTION] * len(records), [judges.image_of(r) for r in records]
    )
    write_captions(os.path.join(out_dir, f"captions_{source['label']}.jsonl"), records, captions)
    return captions, generator


def endpoint_generator(spec, config, out_dir):
    """Returns the judges.EndpointGenerator of an "openai:URL#MODEL" spec (SpecError if malformed)."""
    url, _, model_name = spec[len("openai:") :].partition("#")
    try:
        return judges.EndpointGenerator(
            url,
            model_name,
            max_tokens=config.eval.max_new_tokens,
            cache_dir=os.path.join(out_dir, "endpoint_cache"),
            image_size=config.data.image_size,
        )
    except ValueError as e:
        raise SpecError(f"{spec}: {e}") from None


def make_judge(spec, config, out_dir, setup_cache, self_generator, sees_image):
    """Returns the judge / reader of a spec (see the module docstring; run() has checked it)."""
    if spec == "oracle":  # run() has checked the data is the toy world
        return judges.OracleJudge()
    if spec.startswith("openai:"):
        return judges.ModelJudge(endpoint_generator(spec, config, out_dir), sees_image)
    if spec == "self":
        return judges.ModelJudge(self_generator, sees_image)
    source = resolve(spec)
    return judges.ModelJudge(load_generator(source, config, out_dir, setup_cache), sees_image)


def exact_metrics(records, captions):
    """Returns the toy world's exact caption metrics (mean F1, precision, recall, hallucinated
    objects, words) over the records that have a caption; empty captions count (F1 0)."""
    pairs = [(r["scene"], c) for r, c in zip(records, captions) if c is not None]
    metrics = [tw.caption_metrics(s, c) for s, c in pairs]
    mean = lambda key: float(np.mean([key(m) for m in metrics])) if metrics else float("nan")  # noqa: E731
    return {
        "f1": mean(lambda m: m["f1"]),
        "precision": mean(lambda m: m["precision"]),
        "recall": mean(lambda m: m["recall"]),
        "hallucinated_per_caption": mean(lambda m: len(m["hallucinated"])),
        "caption_words": float(np.mean([winrate.words(c) for _, c in pairs]))
        if pairs
        else float("nan"),
        "empty_captions": sum(not c.strip() for _, c in pairs),
        "images": len(pairs),
        "skipped_no_caption": len(captions) - len(pairs),
    }


def parse_list(text, allowed=None, what="protocol"):
    """Returns the comma list of a flag, refusing names outside `allowed`."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    bad = [i for i in items if allowed is not None and i not in allowed]
    if bad or not items:
        raise SpecError(f"unknown {what}s {bad or text!r}; choose from {allowed}")
    return items


def run(
    config,
    out_dir,
    *,
    model_spec,
    against_spec=None,
    also_specs=(),
    protocols=PROTOCOLS,
    judge_spec="oracle",
    reader_specs=("oracle",),
    num_images=None,
    seed=0,
):
    """Runs the protocols; returns the evaluation dict (also written to <out_dir>/evaluation.json).

    Long because it checks every spec before any work (the protocols' data needs, the judge and
    reader specs) and suffixes duplicate source labels, then makes each source's captions once and
    runs the protocols in order over them; the checks stay here so that a bad spec fails before any
    caption is generated.
    """
    protocols = list(protocols)
    toy = config.data.source == "toyworld"
    if not toy and ("vqa" in protocols or "exact" in protocols):
        raise SpecError(
            "the vqa and exact protocols need toy-world scenes; use winrate,rank on other data"
        )
    # Resolve every spec before any work.
    model = resolve(model_spec)
    others = [resolve(s) for s in ([against_spec] if against_spec else []) + list(also_specs)]
    if ("winrate" in protocols or "rank" in protocols) and not against_spec:
        raise SpecError("winrate and rank compare against a baseline: pass --against")
    used_specs = ([judge_spec] if {"winrate", "rank"} & set(protocols) else []) + (
        list(reader_specs) if "vqa" in protocols else []
    )
    for spec in used_specs:
        if (
            spec not in ("oracle", "self")
            and not spec.startswith("openai:")
            and resolve(spec)["kind"] in ("captions", "toy")
        ):
            raise SpecError(
                f"{spec}: captions cannot judge or read; name a model, 'oracle' or 'self'"
            )
        if spec == "self" and model["kind"] in ("captions", "toy"):
            raise SpecError("judge/reader 'self': the scored source is captions, not a model")
        if spec == "oracle" and not toy:
            raise SpecError(
                "the oracle judge knows only the toy world; name a model judge (--judge=DIR)"
            )
        if spec.startswith("openai:"):
            endpoint_generator(
                spec, config, out_dir
            )  # a malformed spec fails here, before any work
    seen = {model["label"]}
    for k, other in enumerate(
        others, 2
    ):  # the same source twice (a model against itself) gets a suffix
        if other["label"] in seen:
            other["label"] = f"{other['label']}_{k}"
        seen.add(other["label"])
    os.makedirs(out_dir, exist_ok=True)
    records = held_out_records(config, num_images or config.eval.num_scenes)
    setup_cache = {}
    captions, generator = captions_of(model, records, config, out_dir, setup_cache)
    other_captions = {
        o["label"]: captions_of(o, records, config, out_dir, setup_cache)[0] for o in others
    }
    result = {
        "model": model_spec,
        "against": against_spec,
        "also": list(also_specs),
        "num_images": len(records),
        "seed": seed,
        "sources": {
            s["label"]: {k: v for k, v in s.items() if k != "label"} for s in [model, *others]
        },
        "protocols": {},
    }
    judge = None
    if "winrate" in protocols or "rank" in protocols:
        judge = make_judge(judge_spec, config, out_dir, setup_cache, generator, sees_image=True)
    baseline = other_captions[others[0]["label"]] if others else None
    for protocol in protocols:
        if protocol == "winrate":
            out = winrate.win_rate(records, captions, baseline, judge, seed=seed)
        elif protocol == "rank":
            methods = {model["label"]: captions, **other_captions}
            out = rank.blind_rank(records, methods, judge, seed=seed)
        elif protocol == "vqa":
            out = {}
            for spec in reader_specs:
                reader = make_judge(spec, config, out_dir, setup_cache, generator, sees_image=False)
                out[spec] = {
                    label: vqa.caption_vqa(records, caps, reader)
                    for label, caps in {model["label"]: captions, **other_captions}.items()
                }
        else:
            out = {
                label: exact_metrics(records, caps)
                for label, caps in {model["label"]: captions, **other_captions}.items()
            }
        result["protocols"][protocol] = out
    with open(os.path.join(out_dir, "evaluation.json"), "w") as f:
        json.dump(_finite(result), f, indent=1)
    return result


def _finite(value):
    """Returns value with non-finite floats as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fmt(value):
    return (
        "n/a"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else (f"{value:.3f}" if isinstance(value, float) else str(value))
    )


def format_table(result):
    """Returns the evaluation as aligned text tables, one block per protocol.

    Long because each protocol has its own block (winrate's summary lines, then the rank, vqa and
    exact tables with their own columns) reading that protocol's result keys; one function keeps the
    report's layout in one place.
    """
    p = result["protocols"]
    lines = [f"== evaluate: {result['model']} on {result['num_images']} held-out images =="]
    if "winrate" in p:
        w = p["winrate"]
        lines += [
            f"-- pairwise win rate vs {result['against']} (judge {w['judge']}) --",
            f"win rate {_fmt(w['win_rate'])}  95% CI [{_fmt(w['ci95_low'])}, {_fmt(w['ci95_high'])}]  "
            f"win/tie/loss {w['wins']}/{w['ties']}/{w['losses']}  unparseable {w['unparseable']}  "
            f"skipped {w['skipped_no_baseline']}",
            f"mean words: model {_fmt(w['mean_words_model'])}, baseline {_fmt(w['mean_words_baseline'])}; "
            f"judge picked position 1 in {_fmt(w['first_position_pick_rate'])} of decisive verdicts",
        ]
    rows = []
    if "rank" in p:
        r = p["rank"]
        lines.append(
            f"-- blind ranking (judge {r['judge']}, {r['images']} images, unparseable {r['unparseable']}, "
            f"skipped {r['skipped_missing_caption']}) --"
        )
        rows = [("method", "mean rank", "first share", "halluc. penalty")]
        rows += [
            (
                n,
                _fmt(m["mean_rank"]),
                _fmt(m["first_place_share"]),
                _fmt(m["hallucination_penalty"]),
            )
            for n, m in r["methods"].items()
        ]
        lines += _aligned(rows)
    if "vqa" in p:
        rows = [("reader", "method", "accuracy", "G2P", "not given", "unreadable")]
        rows += [
            (
                reader,
                n,
                _fmt(m["accuracy"]),
                _fmt(m["g2p"]),
                _fmt(m["not_given_rate"]),
                str(m["unreadable"]),
            )
            for reader, by_method in p["vqa"].items()
            for n, m in by_method.items()
        ]
        lines.append("-- caption-only VQA --")
        lines += _aligned(rows)
    if "exact" in p:
        rows = [("method", "F1", "precision", "recall", "halluc./caption", "words", "empty")]
        rows += [
            (
                n,
                _fmt(m["f1"]),
                _fmt(m["precision"]),
                _fmt(m["recall"]),
                _fmt(m["hallucinated_per_caption"]),
                _fmt(m["caption_words"]),
                str(m["empty_captions"]),
            )
            for n, m in p["exact"].items()
        ]
        lines.append("-- exact toy-world caption metrics --")
        lines += _aligned(rows)
    return "\n".join(lines)


def _aligned(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
