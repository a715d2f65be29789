"""Multi-host runs on JAX's multi-controller runtime: start-up, process-0-only side effects,
and global arrays assembled from each process's slice of the batch.

Every process runs the same program; each feeds only its rows of the global batch
(`process_rows`), `global_batch` stitches them into one jax.Array per leaf, and every
jitted step then runs on the whole mesh. Start-up reads the config, else MOCOJAX_* variables
set by launch/local_multiprocess.sh, else lets jax.distributed detect SLURM / TPU pods.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

_ENV = {
    "coordinator_address": "MOCOJAX_COORDINATOR",
    "num_processes": "MOCOJAX_NUM_PROCESSES",
    "process_id": "MOCOJAX_PROCESS_ID",
}


def initialize(config: Mapping[str, Any] | None = None) -> bool:
    """Starts jax.distributed when asked; returns True when this run has more than one process.

    config keys (all optional): enabled (bool), coordinator_address ("host:port"),
    num_processes, process_id, local_device_ids. Unset keys fall back to MOCOJAX_COORDINATOR,
    MOCOJAX_NUM_PROCESSES, MOCOJAX_PROCESS_ID; with none of them jax.distributed auto-detects
    the cluster (SLURM, TPU pod, Open MPI). Must run before anything touches a device.
    """
    config = dict(config or {})
    kwargs = {
        k: config.get(k) if config.get(k) is not None else os.environ.get(env)
        for k, env in _ENV.items()
    }
    wanted = config.get("enabled", False) or kwargs["coordinator_address"] is not None
    if not wanted:
        return False
    for key in ("num_processes", "process_id"):
        if kwargs[key] is not None:
            kwargs[key] = int(kwargs[key])
    if config.get("local_device_ids") is not None:
        kwargs["local_device_ids"] = config["local_device_ids"]
    # CPU processes exchange collectives over gloo (TCP); without it a CPU mesh spanning
    # processes cannot run a single all-reduce. GPU and TPU clients ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**{k: v for k, v in kwargs.items() if v is not None})
    logging.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return jax.process_count() > 1


def is_main() -> bool:
    """Returns True on process 0, the one that writes logs, samples and exports."""
    return jax.process_index() == 0


def log(message: str, *args) -> None:
    """Logs (logging.info) on process 0 only."""
    if is_main():
        logging.info(message, *args)


def process_rows(global_rows: int) -> slice:
    """Returns the slice of the global batch's rows this process feeds (contiguous, equal shares)."""
    count, index = jax.process_count(), jax.process_index()
    if global_rows % count:
        raise ValueError(
            f"global batch of {global_rows} rows does not split over {count} processes"
        )
    per = global_rows // count
    return slice(index * per, (index + 1) * per)


def global_batch(local_batch, shardings):
    """Returns the global jax.Arrays assembled from every process's local slice (same tree as shardings).

    Leaves whose sharding is replicated over processes (e.g. vision metadata) must be the
    same full array on every process.
    """
    return jax.tree.map(
        lambda s, x: jax.make_array_from_process_local_data(s, np.asarray(x)),
        shardings,
        local_batch,
    )


def global_from_full(full_batch, shardings):
    """Returns global jax.Arrays of a batch that every process holds in full (same tree as shardings).

    Each process copies only the blocks its own devices hold, so any mesh layout works.
    """
    return jax.tree.map(
        lambda s, x: jax.make_array_from_callback(
            np.shape(x), s, lambda idx, x=x: np.asarray(x)[idx]
        ),
        shardings,
        full_batch,
    )


def process_max(value: int) -> int:
    """Returns the largest of every process's integer `value`."""
    if jax.process_count() == 1:
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def gather_rows(local: np.ndarray) -> np.ndarray:
    """Returns every process's array concatenated along axis 0 in process order (the other dims must agree).

    Leading sizes may differ between processes (e.g. image patches [P_i, D]); the dtype is kept.
    """
    if jax.process_count() == 1:
        return local
    local = np.asarray(local)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(local.shape[0])))
    # process_allgather needs one shape everywhere: pad to the longest, then cut each back.
    padded = np.zeros((max(int(sizes.max()), 1), *local.shape[1:]), local.dtype)
    padded[: len(local)] = local
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return np.concatenate([part[:n] for part, n in zip(gathered, sizes)]).astype(local.dtype)


def fetch(tree):
    """Returns the tree as numpy arrays holding the full global values, on every process.

    Arrays this process holds whole (one process, or replicated ones) are copied directly;
    the others are gathered from every process (a collective: every process must call it).
    """

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return np.asarray(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def sync(name: str) -> None:
    """Blocks until every process reaches the barrier `name` (e.g. before process 0 reads what all wrote)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
