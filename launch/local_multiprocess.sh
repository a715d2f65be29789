#!/usr/bin/env bash
# Runs N processes of one command on this machine as a multi-host JAX run (CPU, gloo collectives):
# the way the tests exercise multi-host code without a cluster.
#
#   launch/local_multiprocess.sh N [-d DEVICES_PER_PROCESS] [-p PORT] -- python -m mocojax.main --config ...
#
# Process i gets MOCOJAX_COORDINATOR=127.0.0.1:PORT, MOCOJAX_NUM_PROCESSES=N, MOCOJAX_PROCESS_ID=i
# (read by mocojax.distributed.initialize) and DEVICES_PER_PROCESS fake CPU devices (default 1).
# Output of process i goes to stdout with an "[i] " prefix; the exit status is the first failure's.
# A `... -m mocojax.main ARGS` command runs its config's stages in order as launch/stage_groups.py
# splits them: sft / rl on the N processes, the others (eval, export) then as one plain process
# on the same workdir. Any other command runs as it is on the N processes.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n '2,12p' "$0"; exit 2
fi
num=$1; shift
devices=1
port=$((20000 + RANDOM % 20000))
while [[ $# -gt 0 && $1 != "--" ]]; do
  case $1 in
    -d) devices=$2; shift 2 ;;
    -p) port=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ ${1:-} == "--" ]] && shift
if [[ $# -eq 0 ]]; then echo "no command given after --" >&2; exit 2; fi

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
run_all() {  # runs "$@" as processes 0..num-1; returns 1 if any failed
  pids=()
  trap cleanup EXIT
  for ((i = 0; i < num; i++)); do
    (
      export JAX_PLATFORMS=cpu
      export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${devices}"
      export MOCOJAX_COORDINATOR="127.0.0.1:${port}" MOCOJAX_NUM_PROCESSES="$num" MOCOJAX_PROCESS_ID="$i"
      exec "$@"
    ) > >(sed -u "s/^/[$i] /") 2>&1 &
    pids+=($!)
  done
  local status=0
  for pid in "${pids[@]}"; do
    if ! wait "$pid"; then
      [[ $status -eq 0 ]] && status=1
    fi
  done
  trap - EXIT
  return $status
}

command=("$@")
for ((i = 0; i + 1 < ${#command[@]}; i++)); do
  if [[ ${command[i]} == -m && ${command[i + 1]} == mocojax.main ]]; then
    python=("${command[@]:0:i}")
    plan=$("${python[@]}" "$(dirname "$0")/stage_groups.py" "${command[@]:i+2}")
    while IFS=$'\t' read -r -u 3 kind stages args; do
      echo "== mocojax: stages $stages, ${kind}-process"
      eval "args=($args)"
      if [[ $kind == multi ]]; then
        run_all "${python[@]}" -m mocojax.main "${args[@]}"
      else
        "${python[@]}" -m mocojax.main "${args[@]}"
      fi
    done 3<<<"$plan"
    exit 0
  fi
done
run_all "$@"
