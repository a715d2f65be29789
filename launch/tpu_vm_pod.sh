#!/usr/bin/env bash
# Runs mocojax on every worker of a Cloud TPU VM pod slice (one process per host).
#
#   launch/tpu_vm_pod.sh TPU_NAME ZONE -- --config configs/qwen3vl_8b_moco.py --workdir gs://bucket/runs/moco8b
#
# The repository is copied to each worker's home, a venv is set up there once
# (SETUP=1 to redo it), then worker 0 splits the config's stages (launch/stage_groups.py):
# sft / rl run on all workers at once (jax.distributed.initialize() finds the pod's coordinator
# from the TPU metadata), the others (eval, export) as one process on worker 0 afterwards.
# The workdir must be visible to every host (a GCS bucket, or a shared filesystem).
set -euo pipefail

if [[ $# -lt 3 || $3 != "--" ]]; then
  sed -n '2,10p' "$0"; exit 2
fi
tpu=$1 zone=$2; shift 3
repo=$(cd "$(dirname "$0")/.." && pwd)
on() { gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker="$1" --command "cd ~/mocojax-src && $2"; }

gcloud compute tpus tpu-vm scp --zone "$zone" --worker=all --recurse \
  "$repo/mocojax" "$repo/configs" "$repo/launch" "$repo/requirements.txt" "$tpu":~/mocojax-src/
if [[ ${SETUP:-0} == 1 ]] || ! on all "test -d .venv" 2>/dev/null; then
  on all "python3 -m venv .venv && .venv/bin/pip install -q -U pip \
    && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]'"
fi
args=$(printf '%q ' "$@")
plan=$(on 0 ".venv/bin/python launch/stage_groups.py $args" | grep -E $'^(multi|single)\t')
while IFS=$'\t' read -r -u 3 kind stages args; do  # args: shell-quoted by launch/stage_groups.py
  echo "== mocojax: stages $stages, ${kind}-process"
  on "$([[ $kind == multi ]] && echo all || echo 0)" ".venv/bin/python -m mocojax.main $args"
done 3<<<"$plan"
