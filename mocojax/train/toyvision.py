"""Toy base, step one: pretrain the vision tower on labelled cells (the "vision" stage).

A VLM's vision encoder comes pretrained (Qwen3-VL's ViT saw billions of images before the
language model ever read its tokens). The toy model's tower starts random, and a decoder
that must discover *both* what the tokens mean and where to look sits on a long plateau
(shared/findings: ~1,000+ steps of image-blind captions). This stage is the toy analogue of
the encoder's pretraining: at 96 px every merged image token covers exactly one cell of the
3x3 grid, so each token gets dense labels (the colour, shape and size of its cell's object,
or "empty", the background, and which cell it is) and a linear probe reads them from the
tower's output tokens. Only the vision tower (and the throw-away probe) learns; the decoder is untouched.
The stage saves the whole model's params as checkpoint "vision", which the SFT stage starts
from (config.sft.init_stage = "vision").

  python -m mocojax.main --config configs/toybase.py --workdir runs/toybase   # runs it first
"""

import functools
import logging
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mocojax import checkpoint, config_utils, metrics as metrics_lib, model, processing
from mocojax.data import toyworld as tw
from mocojax.train import state as state_lib

EMPTY = "empty"
# The vision stage draws its scenes from world seed data.seed + SEED_OFFSET (recorded in the
# base's toybase.json, so no toy eval uses them).
SEED_OFFSET = 7
# Per-token label sets (index 0 = the cell is empty) and the per-image background.
# "cell" asks each token which cell it covers, so the tokens carry their place in their content
# and the decoder can read "where" from what it attends to, not only from rotary positions.
HEADS = {
    "colour": (EMPTY,) + tuple(tw.COLOURS),
    "shape": (EMPTY,) + tw.SHAPES,
    "size": (EMPTY,) + tw.SIZES,
    "background": tuple(tw.BACKGROUNDS),
    "cell": tw.POSITIONS,
}


def cell_labels(scene):
    """Returns {head: int [9]} labels of a scene's cells in row-major order (= merged-token order at 96 px)."""
    by_cell = {o.position: o for o in scene.objects}
    labels = {name: np.zeros(len(tw.POSITIONS), np.int32) for name in HEADS}
    for k, cell in enumerate(tw.POSITIONS):
        obj = by_cell.get(cell)
        if obj is not None:
            labels["colour"][k] = HEADS["colour"].index(obj.colour)
            labels["shape"][k] = HEADS["shape"].index(obj.shape)
            labels["size"][k] = HEADS["size"].index(obj.size)
        labels["background"][k] = HEADS["background"].index(scene.background)
        labels["cell"][k] = k
    return labels


def image_batch(cfg, scenes, image_size, min_pixels, max_pixels):
    """Returns (pixel_values [P, patch_dim], VisionMeta, labels {head: [B*9]}) of rendered scenes."""
    images = [tw.render(scene, image_size) for scene in scenes]
    pixels, grid = processing.preprocess_images(
        images, min_pixels=min_pixels, max_pixels=max_pixels
    )
    tokens = processing.num_image_tokens(grid)
    if not (tokens == len(tw.POSITIONS)).all():
        raise ValueError(
            f"the vision stage needs one image token per grid cell ({len(tw.POSITIONS)}); "
            f"images of {image_size} px give {sorted(set(tokens.tolist()))}: set data.image_size=96 "
            "and data.min_pixels = data.max_pixels = 96 * 96"
        )
    labels = [cell_labels(scene) for scene in scenes]
    stacked = {name: np.concatenate([lab[name] for lab in labels]) for name in HEADS}
    return pixels, model.vision_metadata(cfg.vision, grid), stacked


def init_probe(cfg, seed):
    """Returns the linear probe {head: {"w" [D, classes], "b" [classes]}} on the tower's output tokens."""
    keys = jax.random.split(jax.random.key(seed), len(HEADS))
    return {
        name: {
            "w": 0.02 * jax.random.normal(key, (cfg.text.hidden_size, len(classes)), jnp.float32),
            "b": jnp.zeros((len(classes),), jnp.float32),
        }
        for key, (name, classes) in zip(keys, HEADS.items())
    }


def probe_loss(cfg, trainable, text_params, pixel_values, vision, labels):
    """Returns (summed mean cross-entropy of the heads, per-head accuracy) of the tower + probe."""
    params = {"text": text_params, "visual": trainable["visual"]}
    tokens = model.encode_images(cfg, params, pixel_values, vision)[0].astype(jnp.float32)
    total, accuracy = 0.0, {}
    for name, head in trainable["probe"].items():
        logits = tokens @ head["w"] + head["b"]
        total = total + optax.softmax_cross_entropy_with_integer_labels(logits, labels[name]).mean()
        accuracy[name] = (logits.argmax(-1) == labels[name]).mean()
    return total, accuracy


def train_step(cfg, optimizer, text_params, state, batch):
    """Returns (new state, metrics): one AdamW update of the tower and the probe (the decoder is a constant)."""
    (loss, accuracy), grads = jax.value_and_grad(probe_loss, argnums=1, has_aux=True)(
        cfg, state["params"], text_params, batch["pixel_values"], batch["vision"], batch["labels"]
    )
    new_state, update = state_lib.apply_gradients(state, grads, optimizer, loss)
    return new_state, {"loss": loss, **{f"acc_{k}": v for k, v in accuracy.items()}, **update}


def run_vision(config, workdir):
    """Pretrains the vision tower (skipped when checkpoint "vision" exists); returns the final metrics."""
    vc, data = config.vision, config.data
    setup = config_utils.build_setup(config, workdir)
    cfg = setup.model_config
    if checkpoint.latest_step(workdir, "vision") is not None:
        logging.info("vision stage: checkpoint exists in %s, skipped", workdir)
        return {}
    params = setup.load_params()
    opt = config.optimizer.to_dict()
    opt.update(lr=vc.lr, warmup_ratio=0.05, end_lr_ratio=0.1)
    optimizer = state_lib.make_optimizer(ml_collections.ConfigDict(opt), vc.num_steps)
    trainable = {"visual": params["visual"], "probe": init_probe(cfg, config.seed)}
    state = state_lib.init_state(trainable, optimizer, jax.random.key(config.seed))
    step_fn = jax.jit(functools.partial(train_step, cfg, optimizer), donate_argnums=(1,))
    writer = metrics_lib.MetricWriter(workdir, "vision", total_steps=vc.num_steps, initial_step=0)
    last = {}
    for step in range(1, vc.num_steps + 1):
        t0 = time.perf_counter()
        # Scenes of their own (index space above the SFT data), a fresh batch every step.
        scenes = tw.make_scenes(
            data.seed + SEED_OFFSET, vc.batch_size, start=(step - 1) * vc.batch_size
        )
        pixels, vision, labels = image_batch(
            cfg, scenes, data.image_size, data.min_pixels, data.max_pixels
        )
        batch = {
            "pixel_values": jnp.asarray(pixels, cfg.dtype),
            "vision": jax.tree.map(jnp.asarray, vision),
            "labels": jax.tree.map(jnp.asarray, labels),
        }
        state, metrics = step_fn(params["text"], state, batch)
        last = {k: float(v) for k, v in jax.device_get(metrics).items()}
        last["step_time_s"] = time.perf_counter() - t0
        writer.write(step, last)
    writer.close()
    params = dict(params, visual=state["params"]["visual"])
    manager = checkpoint.Manager(workdir, "vision", keep=1)
    manager.save(vc.num_steps, {"params": params, "step": state["step"], "rng": state["rng"]}, {})
    manager.close()
    logging.info(
        "vision stage: probe accuracy %s",
        {k: round(v, 3) for k, v in last.items() if k.startswith("acc_")},
    )
    return last
