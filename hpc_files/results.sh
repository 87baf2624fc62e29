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
# The work is hpc_files/lib/results.py (matplotlib for the PNGs), run by
# the python login_python (lib/common.sh) chooses.
set -euo pipefail

HPC_FILES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HPC_PROG=results.sh
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"

usage() {
  cat <<USAGE
usage: results.sh EXP|JOBID [--sort METRIC[:max|min]] [--no-group] [--metrics A,B]
                  [--csv FILE] [--plot FILE.png] [--curves FILE.png] [--project NAME]
       results.sh --run RUN_DIR|CSV --curves FILE.png [--metrics A,B]

One row per configuration of the newest submission of experiment EXP (or the
submission whose job id is JOBID) under \$SCRATCH/$project_name/: its trials, its
parameters, n, state, and for every metric its final and best value (mean ± std
over the seeds of the configuration; failed trials are listed but left out of
the mean unless all failed; a configuration whose every trial failed sorts
last). Metrics come from each trial's metrics.csv; for a wandb sweep array
(-w), from each task's run (<exp>/runs/<run id>/), its parameters from the
run's run.json.

  -s, --sort METRIC[:max|min]  sort by METRIC's final value (default: the sweep
                     file's metric: name and goal when it was logged, else
                     the first of --metrics, else the first logged metric;
                     max unless the name says loss/error)
  --no-group         one row per trial (seeds not grouped)
  -m, --metrics A,B  show only these metrics (default: every logged metric)
  --csv FILE         also write the table as CSV (mean and std in own columns)
  --plot FILE.png    draw the sort metric against each parameter (matplotlib)
  --curves FILE.png  draw the training curves: one panel per metric (those of
                     --metrics), value against global step, one line per trial
  --run RUN_DIR|CSV  instead of EXP: one run outside SLURM (a laptop run), its
                     folder (metrics.csv in it or one folder below, e.g.
                     checkpoints/) or its metrics.csv; takes --curves and
                     --metrics only, needs no \$SCRATCH
  --project NAME     the project folder under \$SCRATCH (default: $project_name,
                     the folder holding hpc_files/)
  -h, --help         show this help
USAGE
}

run_results_py results "$@"
