#!/usr/bin/env bash
# Runs N processes of one command on this machine as a multi-host JAX run (CPU, gloo collectives):
# the way the tests exercise multi-host code without a cluster.
#
#   launch/local_multiprocess.sh N [-d DEVICES_PER_PROCESS] [-p PORT] -- python -m mocojax.main --config ...
#
# Process i gets MOCOJAX_COORDINATOR=127.0.0.1:PORT, MOCOJAX_NUM_PROCESSES=N, MOCOJAX_PROCESS_ID=i
# (read by mocojax.distributed.initialize) and DEVICES_PER_PROCESS fake CPU devices (default 1).
# Output of process i goes to stdout with an "[i] " prefix; the exit status is the first failure's.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n '2,10p' "$0"; exit 2
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
status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    [[ $status -eq 0 ]] && status=1
  fi
done
trap - EXIT
exit $status
