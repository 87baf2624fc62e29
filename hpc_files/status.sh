#!/usr/bin/env bash
# status.sh: where a submission stands, one row per task (array task or the
# plain job): state, restarts (requeues), elapsed time and the last progress
# line. States come from one 'scontrol show job -o' call while SLURM still
# knows the job, else from the task's log; no sacct is needed.
#
#   hpc_files/status.sh                 the newest submission of the project
#   hpc_files/status.sh EXP             the newest submission of experiment EXP
#   hpc_files/status.sh JOBID           the submission whose job id is JOBID (or JOBID_TASK)
#   hpc_files/status.sh EXP --watch 10  redraw every 10 s (a terminal only)
#
# The table work is hpc_files/hpc_tools/status.py (standard library), run by the
# python login_python (lib/common.sh) chooses.
set -euo pipefail

HPC_FILES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"

run_results_py status "$@"
