#!/usr/bin/env bash
# Runs a job_submitter.sh unchanged (same arguments, output and exit status)
# and appends 'SECONDS<TAB>COMMAND' to TRACE as each command of its main()
# starts (SECONDS: bash 5's EPOCHREALTIME), so a step of main() lasts until
# the next line. bench/submit_latency.sh times the steps with it.
# The submitter knows nothing of it: sourced, job_submitter.sh defines its
# functions and runs nothing; then a DEBUG trap that functions inherit
# (set -T) writes a line only for commands whose function is main, and
# main runs. Commands in the functions main calls are not traced.
#
# Usage: bench/trace_submit.sh TRACE PATH/TO/hpc_files/job_submitter.sh [ARG...]
set -euo pipefail

(($# >= 2)) || {
  echo "usage: ${0##*/} TRACE PATH/TO/hpc_files/job_submitter.sh [ARG...]" >&2
  exit 2
}
# Names of the tracer's own: the submitter's globals are lower case or HPC_*.
BENCH_TRACE_FILE=$1
BENCH_TRACE_SUBMITTER=$2
shift 2
# shellcheck source=../hpc_files/job_submitter.sh
source "$BENCH_TRACE_SUBMITTER"
set -T
# A file that cannot be written loses the trace, not the submission (a
# failed redirection would end main under set -e).
# shellcheck disable=SC2016 # expanded when the trap runs
trap '[[ "${FUNCNAME[0]-}" != main ]] || { printf "%s\t%s\n" "${EPOCHREALTIME/,/.}" "$BASH_COMMAND" >>"$BENCH_TRACE_FILE"; } 2>/dev/null || :' DEBUG
main "$@"
