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

HPC_FILES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HPC_PROG=stop.sh
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=lib/experiment.sh
source "$HPC_FILES_DIR/lib/experiment.sh"

stop_main "$@"
