#!/usr/bin/env bash
# Runs `wandb agent ARGS...` (one array task of a wandb sweep, started by
# launch.sh inside the runtime) and fails when a run it started failed:
# `wandb agent` itself exits 0 even when every run failed. The agent starts
# runs with `python` from PATH, so a shim first on PATH runs the real python
# and records each run's exit status; this script exits with the first
# non-zero one.
#
# Usage: wandb_agent.sh agent [--count N] SWEEP_ID
set -euo pipefail

real_python=$(command -v python || command -v python3) || {
  echo "hpc: error: no python on PATH for the wandb agent's runs" >&2
  exit 1
}
status_dir=$(mktemp -d "${TMPDIR:-/tmp}/hpc-wandb.XXXXXX")
trap 'rm -rf -- "${status_dir:?}"' EXIT
mkdir -p "$status_dir/bin"
cat >"$status_dir/bin/python" <<SHIM
#!/usr/bin/env bash
# Written by wandb_agent.sh: records the run's exit status.
status=0
"$real_python" "\$@" || status=\$?
printf '%s\n' "\$status" >"$status_dir/\${WANDB_RUN_ID:-run\$\$}.status"
exit "\$status"
SHIM
chmod +x "$status_dir/bin/python"
ln -s python "$status_dir/bin/python3"

agent_status=0
PATH="$status_dir/bin:$PATH" wandb "$@" || agent_status=$?
((agent_status == 0)) || exit "$agent_status"

runs=0
for file in "$status_dir"/*.status; do
  [[ -e "$file" ]] || continue
  runs=$((runs + 1))
  status=$(<"$file")
  if [[ "$status" != 0 ]]; then
    run=${file##*/}
    echo "hpc: error: wandb run ${run%.status} exited with code $status (wandb agent reported success)" >&2
    exit "$status"
  fi
done
echo "hpc: wandb agent finished $runs run(s), all succeeded"
