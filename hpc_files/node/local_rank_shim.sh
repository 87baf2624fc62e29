#!/usr/bin/env bash
# Runs one torchrun worker with its local rank appended, for programs written
# for torch.distributed.launch (launch.sh uses it with --pass-local-rank):
# --local-rank=N, or --local_rank=N when HPC_PASS_LOCAL_RANK is 'underscore'
# (--pass-local-rank=underscore; older programs parse that spelling).
# Usage: local_rank_shim.sh (--no-python PROGRAM | -m MODULE | SCRIPT) [ARG...]
set -euo pipefail
: "${LOCAL_RANK:?torchrun sets LOCAL_RANK}"
flag=--local-rank
[[ "${HPC_PASS_LOCAL_RANK:-}" != underscore ]] || flag=--local_rank
if [[ "${1:-}" == --no-python ]]; then
  shift
  exec "$@" "$flag=$LOCAL_RANK"
fi
exec python "$@" "$flag=$LOCAL_RANK"
