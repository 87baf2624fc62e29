#!/usr/bin/env bash
# results.sh: the results of an experiment's newest submission, one row per
# trial (or per configuration, its seeds grouped as mean ± std): parameters
# from trials.jsonl, state (finished, failed (exit N), requeued N times,
# pending/running) and the final and best value of every metric in each
# trial's metrics.csv, sorted by one metric. Optionally a CSV and PNGs: the
# sort metric against each parameter, and the training curves (of the trials,
# or of one run outside SLURM with --run).
#
#   hpc_files/results.sh EXP
#   hpc_files/results.sh EXP --sort test_loss:min --no-group
#   hpc_files/results.sh EXP --csv results.csv --plot results.png --curves curves.png
#   hpc_files/results.sh --run checkpoints --curves curves.png
#
# The work is hpc_files/hpc_tools/results.py (matplotlib for the PNGs), run by
# the python login_python (lib/common.sh) chooses.
set -euo pipefail

HPC_FILES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"

run_results_py results "$@"
