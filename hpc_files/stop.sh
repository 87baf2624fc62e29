#!/usr/bin/env bash
# stop.sh: stops an experiment as one thing: cancels every job of it (array
# jobs, the method-bayes controller, venv setup jobs) and records the stop in
# the experiment folder, so no later bayes round starts. See --help.
#
#   hpc_files/stop.sh EXP      the jobs of experiment EXP of this project
#   hpc_files/stop.sh JOBID    the experiment of the submission that ran JOBID
#
# The work is stop_main in hpc_files/lib/experiment.sh.
set -euo pipefail

# Its folder from its path (no dirname process); '.' when run by its name.
HPC_FILES_DIR=${BASH_SOURCE[0]%/*}
[[ "$HPC_FILES_DIR" != "${BASH_SOURCE[0]}" ]] || HPC_FILES_DIR=.
HPC_FILES_DIR=$(cd "$HPC_FILES_DIR" && pwd)
HPC_PROG=stop.sh
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=lib/experiment.sh
source "$HPC_FILES_DIR/lib/experiment.sh"

stop_main "$@"
