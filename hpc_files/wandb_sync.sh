#!/usr/bin/env bash
# wandb_sync.sh: the login-node syncer of --wandb-sync login. Runs wandb-osh's
# syncer on an experiment's trigger folder ($SCRATCH/<project>/EXP/wandb_osh)
# until no job of the experiment is queued or running, syncs every run once
# more, and exits. Meant to run under tmux or screen:
#
#   tmux new -d -s sync 'bash hpc_files/wandb_sync.sh EXP'
#   hpc_files/wandb_sync.sh                 the newest submission's experiment
#   hpc_files/wandb_sync.sh EXP --poll 30   ask squeue every 30 s
#
# The work and the help (-h, --help) are hpc_tools/wandb_sync.py's, run by
# the python login_python (lib/common.sh) chooses: it needs wandb-osh.
set -euo pipefail

# Its folder from its path (no dirname process); '.' when run by its name.
HPC_FILES_DIR=${BASH_SOURCE[0]%/*}
[[ "$HPC_FILES_DIR" != "${BASH_SOURCE[0]}" ]] || HPC_FILES_DIR=.
HPC_FILES_DIR=$(cd "$HPC_FILES_DIR" && pwd)
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"

project_paths
HPC_PROJECT_NAME=$project_name PYTHONPATH=$(hpc_tools_path) exec "$(login_python)" -m hpc_tools.wandb_sync "$@"
