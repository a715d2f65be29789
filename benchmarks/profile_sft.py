"""Where the default toy job's SFT step spends its time (docs/performance.md), on CPU.

  python benchmarks/profile_sft.py --batches 24 --repeats 3

Builds the default toy-world SFT data (configs/toyworld.py:paper: role-grouped batches of 16, the
shipped toy base model) and reports, per role: real / padded tokens per batch, the host-side
time of one batch (grain rendering + micro-batching), the jitted step alone, and a split of the
step's forward + backward into the vision tower, the decoder layers (attention and MLP timed
separately on the same shapes), and the logits + log-softmax; then the whole loop (host work,
step, metrics fetch) over --batches batches in the data order.
"""

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The repository root, for `configs` (and this checkout's mocojax) when run as a script.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from configs import toyworld  # noqa: E402
from mocojax import config_utils, model  # noqa: E402
from mocojax.data import pipeline, records as records_lib  # noqa: E402
from mocojax.model import qwen3_vl  # noqa: E402
from mocojax.train import sft, state as state_lib  # noqa: E402


def toy_setup(num_scenes):
    """Returns (config, setup, train examples) of the default toy job on num_scenes scenes."""
    config = toyworld.paper_config()
    config.data.num_train_scenes = num_scenes
    setup = config_utils.build_setup(config, tempfile.mkdtemp())
    train, _ = config_utils.sft_examples(config, setup.processor)
    return config, setup, train


def host_batches(config, setup, train, count):
    """Returns [(host batch, seconds to render it)] of the first count batches, in the run's order."""
    data = config.data
    it = iter(
        pipeline.sft_dataset(
            train,
            setup.processor,
            global_batch_size=config.sft.global_batch_size,
            seed=data.seed,
            buckets=tuple(data.length_buckets),
            image_size=data.image_size,
            group_by_role=data.group_by_role,
        )
    )
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        batch = next(it)
        out.append((batch, time.perf_counter() - t0))
    return out


def timed(fn, *args, repeats):
    """Returns the best of `repeats` wall-clock seconds of fn(*args) after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def component_times(cfg, params, micro, repeats):
    """Returns {component: seconds} of forward + backward (w.r.t. params and inputs) of the step's parts."""
    t, m = cfg.text, jax.tree.map(lambda x: jnp.asarray(x[0]), micro)
    rows, length = m["input_ids"].shape
    key = jax.random.key(0)
    x = jax.random.normal(key, (rows, length, t.hidden_size), jnp.float32)
    mask = qwen3_vl.attention_mask_4d(m["attention_mask"], length, 0)
    cos, sin = model.rope.text_rope(t, m["positions"], jnp.float32)

    def vision(p):
        tokens, ds = qwen3_vl._merge(cfg, p).visual(m["pixel_values"], m["vision"])
        return tokens.sum() + ds.sum()

    def decoder(p, h):
        return qwen3_vl._merge(cfg, p).text.decode(h, cos, sin, mask)[0].sum()

    def logits(p, h):
        return model.target_logprobs(cfg, p, h[:, :-1], m["input_ids"][:, 1:]).sum()

    n, k, hd, d, f = (
        t.num_attention_heads,
        t.num_key_value_heads,
        t.head_dim,
        t.hidden_size,
        t.intermediate_size,
    )
    w = lambda *shape: jax.random.normal(key, shape, jnp.float32) * 0.02
    attn_w = (w(d, n, hd), w(d, k, hd), w(d, k, hd), w(n, hd, d))
    mlp_w = (w(d, f), w(d, f), w(f, d))

    def attention(ws, h):  # one layer's projections + masked attention (no norms / rope)
        q, kk, v, o = ws
        out = jax.nn.dot_product_attention(
            jnp.einsum("btd,dnh->btnh", h, q),
            jnp.einsum("btd,dnh->btnh", h, kk),
            jnp.einsum("btd,dnh->btnh", h, v),
            mask=mask,
            scale=hd**-0.5,
        )
        return jnp.einsum("btnh,nhd->btd", out, o).sum()

    def mlp(ws, h):
        gate, up, down = ws
        return ((jax.nn.silu(h @ gate) * (h @ up)) @ down).sum()

    grad = lambda fn, *a: jax.jit(jax.grad(fn, argnums=tuple(range(len(a)))))
    return {
        "vision tower": timed(grad(vision, params), params, repeats=repeats),
        "decoder layers": timed(grad(decoder, params, x), params, x, repeats=repeats),
        "  attention (per layer x layers)": t.num_hidden_layers
        * timed(grad(attention, attn_w, x), attn_w, x, repeats=repeats),
        "  MLP (per layer x layers)": t.num_hidden_layers
        * timed(grad(mlp, mlp_w, x), mlp_w, x, repeats=repeats),
        "logits + log-softmax": timed(grad(logits, params, x), params, x, repeats=repeats),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenes", type=int, default=400)
    args = parser.parse_args(argv)
    config, setup, train = toy_setup(args.scenes)
    cfg = setup.model_config
    params = setup.load_params()
    optimizer = state_lib.make_optimizer(config.optimizer, config.sft.num_steps)
    step = jax.jit(lambda s, b: sft.train_step(cfg, optimizer, s, b), donate_argnums=0)
    batches = host_batches(config, setup, train, args.batches)
    prep = lambda b: sft.micro_batches(cfg, b, config.sft.grad_accum_steps, config.data.max_patches)

    print("## Padding per role (rows x bucket)\n")
    print(
        "| role | batches | bucket | real tokens / batch | target tokens / batch | padded | real fraction |"
    )
    print("|---|---|---|---|---|---|---|")
    by_role = collections.defaultdict(list)
    for batch, seconds in batches:
        by_role[records_lib.ROLES[int(batch["role"][0])]].append((batch, seconds))
    for role, items in by_role.items():
        real = np.mean([b["attention_mask"].sum() for b, _ in items])
        target = np.mean([b["loss_mask"].sum() for b, _ in items])
        shapes = sorted({b["input_ids"].shape for b, _ in items})
        padded = np.mean([b["input_ids"].size for b, _ in items])
        print(
            f"| {role} | {len(items)} | {', '.join(str(s[1]) for s in shapes)} | {real:,.0f} | "
            f"{target:,.0f} | {padded:,.0f} | {real / padded:.2f} |"
        )

    print("\n## Step time per role (best of repeats; host work timed separately)\n")
    print("| role | host render s | micro-batch s | jitted step s | real tok/s (step only) |")
    print("|---|---|---|---|---|")
    state = state_lib.init_state(params, optimizer, jax.random.key(0))
    state = jax.tree.map(jnp.copy, state)
    for role, items in by_role.items():
        batch, render = items[0]
        t0 = time.perf_counter()
        host = prep(batch)
        micro_s = time.perf_counter() - t0
        dev = jax.device_put(host)
        best = float("inf")
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            state, metrics = step(state, dev)
            jax.block_until_ready(metrics)
            if i:
                best = min(best, time.perf_counter() - t0)
        real = batch["attention_mask"].sum()
        render = np.mean([s for _, s in items])
        print(f"| {role} | {render:.3f} | {micro_s:.3f} | {best:.3f} | {real / best:,.0f} |")

    print("\n## Forward + backward of the step's parts (seconds, best of repeats)\n")
    roles = list(by_role)
    print("| part | " + " | ".join(roles) + " |\n|---|" + "---|" * len(roles))
    parts = {
        role: component_times(cfg, params, prep(by_role[role][0][0]), args.repeats)
        for role in roles
    }
    for name in parts[roles[0]]:
        print(f"| {name} | " + " | ".join(f"{parts[r][name]:.3f}" for r in roles) + " |")

    print("\n## Whole loop over the batches in order (host + step + metrics fetch)\n")
    t_loop = t_step = 0.0
    real = target = 0
    for batch, render in batches:
        t0 = time.perf_counter()
        dev = jax.device_put(prep(batch))
        t1 = time.perf_counter()
        state, metrics = step(state, dev)
        jax.device_get(metrics)
        t2 = time.perf_counter()
        t_loop += render + t2 - t0
        t_step += t2 - t1
        real += int(batch["attention_mask"].sum())
        target += int(batch["loss_mask"].sum())
    print(
        f"{len(batches)} batches: loop {t_loop:.2f} s (step {t_step:.2f} s, host {t_loop - t_step:.2f} s); "
        f"{real / t_loop:,.0f} real tokens/s, {target / t_loop:,.0f} target tokens/s"
    )


if __name__ == "__main__":
    sys.exit(main())
