#!/usr/bin/env bash
# Runs one torchrun worker with --local-rank=N appended, for programs written
# for torch.distributed.launch (launch.sh uses it with --pass-local-rank).
# Usage: local_rank_shim.sh (--no-python PROGRAM | -m MODULE | SCRIPT) [ARG...]
set -euo pipefail
: "${LOCAL_RANK:?torchrun sets LOCAL_RANK}"
if [[ "${1:-}" == --no-python ]]; then
  shift
  exec "$@" --local-rank="$LOCAL_RANK"
fi
exec python "$@" --local-rank="$LOCAL_RANK"
