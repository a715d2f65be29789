"""grain pipelines: role examples -> shuffled, tokenized, bucket-padded, per-host batches.

Order of operations, all deterministic given `seed`:
  examples --shuffle(seed), reshuffled every epoch--> --global batches of global_batch_size-->
  --this host's contiguous slice (process_index of process_count)--> --Processor + padding-->

Because batching happens on the global order before the host split, the union of all hosts'
batches at step t is exactly the single-host batch at step t, whatever the host count.
The iterator is grain's: `it.get_state()` is a small JSON-ready dict and
`it.set_state(state)` on a fresh iterator resumes with exactly the batches an uninterrupted
run would have produced (save it with each checkpoint).
"""

import grain
import numpy as np

from mocojax.data import records as records_lib

DEFAULT_BUCKETS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)


def bucket_length(length, buckets):
    """Returns the smallest bucket >= length; raises if length exceeds every bucket."""
    for bucket in sorted(buckets):
        if bucket >= length:
            return bucket
    raise ValueError(
        f"sequence of {length} tokens is longer than the largest length bucket "
        f"{max(buckets)}; add a bucket or set the Processor's max_length"
    )


def pad_to(batch, length, pad_token_id):
    """Returns the batch with its [B, L] arrays right-padded to [B, length]."""
    padded = dict(batch)
    for key, value in batch.items():
        if (
            isinstance(value, np.ndarray)
            and value.ndim == 2
            and key not in ("pixel_values", "image_grid_thw")
        ):
            fill = pad_token_id if key == "input_ids" else 0
            padded[key] = np.pad(
                value, ((0, 0), (0, length - value.shape[1])), constant_values=fill
            )
    return padded


def host_slice(global_batch, process_index, process_count):
    """Returns this host's contiguous share of a global batch (a list)."""
    if len(global_batch) % process_count:
        raise ValueError(
            f"global batch of {len(global_batch)} does not split over {process_count} hosts"
        )
    size = len(global_batch) // process_count
    return global_batch[process_index * size : (process_index + 1) * size]


class RenderSFT:
    """Turns a list of role examples into one padded SFT batch via the Processor."""

    def __init__(self, processor, buckets, image_size):
        self.processor = processor
        self.buckets = buckets
        self.image_size = image_size

    def __call__(self, examples):
        """Returns the Processor's SFT arrays [B, bucket] (+ pixel_values) and role [B] int32."""
        conversations = [
            records_lib.conversation(e, records_lib.example_image(e, self.image_size))
            for e in examples
        ]
        batch = self.processor(conversations, mode="sft")
        batch = pad_to(
            batch,
            bucket_length(batch["input_ids"].shape[1], self.buckets),
            self.processor.pad_token_id,
        )
        batch["role"] = np.asarray([records_lib.ROLES.index(e["role"]) for e in examples], np.int32)
        return batch


def role_batches(examples, global_batch_size, seed):
    """Returns global batches (lists of examples) that each hold one role.

    Each role's examples are shuffled by `seed` and cut into full batches (the remainder is
    dropped); roles then keep their share of the batches (the 2:1:1 mix becomes a 2:1:1 mix
    of batches). Short Policy rows no longer pad to the Generator's 400-550 tokens.
    """
    rng = np.random.default_rng(seed)
    batches = []
    for role in records_lib.ROLES:
        rows = [e for e in examples if e["role"] == role]
        order = rng.permutation(len(rows))
        batches += [
            [rows[i] for i in order[j : j + global_batch_size]]
            for j in range(0, len(rows) - global_batch_size + 1, global_batch_size)
        ]
    if not batches:
        raise ValueError(f"no role has {global_batch_size} examples to fill one batch")
    return batches


def sft_dataset(
    examples,
    processor,
    *,
    global_batch_size,
    seed,
    num_epochs=None,
    process_index=0,
    process_count=1,
    buckets=DEFAULT_BUCKETS,
    image_size=128,
    group_by_role=False,
):
    """Returns a grain IterDataset of this host's SFT batches (dicts of numpy arrays).

    Each batch has global_batch_size // process_count rows: input_ids, attention_mask,
    mm_token_type_ids, loss_mask [B, L] with L a length bucket, pixel_values [P, 1536],
    image_grid_thw [I, 3] (None when no row has an image), truncated [B] and role [B]
    (index into records.ROLES, for per-role losses). The last partial global batch of the
    run is dropped. num_epochs=None repeats forever. group_by_role: every batch holds one role
    (`role_batches`; batch order reshuffled every epoch, compositions fixed), so each pads to
    its own role's length bucket.
    """
    if not examples:
        raise ValueError("no examples to train on")
    if group_by_role:
        dataset = grain.MapDataset.source(role_batches(examples, global_batch_size, seed))
        dataset = dataset.shuffle(seed=seed).repeat(num_epochs)
    else:
        dataset = grain.MapDataset.source(list(examples)).shuffle(seed=seed).repeat(num_epochs)
        dataset = dataset.batch(global_batch_size, drop_remainder=True, batch_fn=list)
    dataset = dataset.map(lambda batch: host_slice(batch, process_index, process_count))
    dataset = dataset.map(RenderSFT(processor, buckets, image_size))
    return dataset.to_iter_dataset()


def rl_dataset(
    records,
    *,
    global_batch_size,
    seed,
    num_epochs=None,
    process_index=0,
    process_count=1,
    image_size=128,
):
    """Returns a grain IterDataset of this host's RL groups: lists of {id, image, references}.

    `image` is the loaded PIL image, so the RL step can build Policy prompts (Processor,
    mode="generate") and Generator prompts from the same picture without reading it twice.
    """
    if not records:
        raise ValueError("no records for RL")

    def load(batch):
        return [
            {
                "id": r["id"],
                "references": r["references"],
                "image": records_lib.example_image({"role": "policy", **r}, image_size),
            }
            for r in host_slice(batch, process_index, process_count)
        ]

    dataset = grain.MapDataset.source(list(records)).shuffle(seed=seed).repeat(num_epochs)
    dataset = dataset.batch(global_batch_size, drop_remainder=True, batch_fn=list)
    return dataset.map(load).to_iter_dataset()
