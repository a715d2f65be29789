#!/usr/bin/env bash
# Runs mocojax on every worker of a Cloud TPU VM pod slice (one process per host).
#
#   launch/tpu_vm_pod.sh TPU_NAME ZONE -- --config configs/qwen3vl_8b_moco.py --workdir gs://bucket/runs/moco8b
#
# The repository is copied to each worker's home, a venv is set up there once
# (SETUP=1 to redo it), then `python -m mocojax.main` starts on all workers at once;
# jax.distributed.initialize() finds the pod's coordinator from the TPU metadata.
# The workdir must be visible to every host (a GCS bucket, or a shared filesystem).
set -euo pipefail

if [[ $# -lt 3 || $3 != "--" ]]; then
  sed -n '2,9p' "$0"; exit 2
fi
tpu=$1 zone=$2; shift 3
repo=$(cd "$(dirname "$0")/.." && pwd)
ssh_all() { gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$1"; }

gcloud compute tpus tpu-vm scp --zone "$zone" --worker=all --recurse \
  "$repo/mocojax" "$repo/configs" "$repo/requirements.txt" "$tpu":~/mocojax-src/
if [[ ${SETUP:-0} == 1 ]] || ! ssh_all "test -d ~/mocojax-src/.venv" 2>/dev/null; then
  ssh_all "cd ~/mocojax-src && python3 -m venv .venv && .venv/bin/pip install -q -U pip \
    && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]'"
fi
args=$(printf '%q ' "$@")
ssh_all "cd ~/mocojax-src && .venv/bin/python -m mocojax.main --config.distributed.enabled=True $args"
