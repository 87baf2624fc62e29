#!/usr/bin/env bash
# Runs hpc_files/job_submitter.sh's own main() with every step timed, for
# bench/submit_latency.sh. The submitter's code is loaded unchanged (all but
# its final 'main "$@"' line, with HPC_FILES_DIR pointing at hpc_files/);
# each function main() calls, a few nested ones (trials.py, the data manifest,
# rendering) and the sbatch and git commands are wrapped by a timer.
#
# Usage: BENCH_PHASES=FILE bench/submit_phases.sh [job_submitter options] -- CMD
# Appends 'phase<TAB>microseconds' lines to FILE (nested phases are included
# in their parents' time); stdout and stderr are the submitter's.
set -euo pipefail

bench_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The project whose submitter runs (BENCH_PROJECT: a user's project made by
# bench/lib.sh), by default this repository.
project_root=${BENCH_PROJECT:-$bench_root}
submitter="$project_root/hpc_files/job_submitter.sh"
: "${BENCH_PHASES:?names the file that receives the phase timings}"
t_script_start=${EPOCHREALTIME/./}

# Nested functions and commands worth their own line (besides main's steps).
NESTED_PHASES=(write_trials list_trials data_manifest data_cache_matches login_python snapshot_code record_git_state git sbatch)

__bench_time() {
  local name=$1 t0 rc
  shift
  t0=${EPOCHREALTIME/./}
  "$@"
  rc=$?
  printf '%s\t%s\n' "$name" "$((${EPOCHREALTIME/./} - t0))" >>"$BENCH_PHASES"
  return "$rc"
}

# wrap_function NAME: NAME now runs under the timer.
wrap_function() {
  local fn=$1 body
  declare -F "$fn" >/dev/null || return 0
  body=$(declare -f "$fn")
  eval "__bench_orig_${body}"
  eval "$fn() { __bench_time $fn __bench_orig_$fn \"\$@\"; }"
}

# wrap_command NAME: the external command NAME runs under the timer.
wrap_command() {
  eval "$1() { __bench_time $1 command $1 \"\$@\"; }"
}

source_text=$(sed -e '$ {/^main "\$@"$/d}' \
  -e "s|^HPC_FILES_DIR=.*|HPC_FILES_DIR=$project_root/hpc_files|" "$submitter")
[[ "$(tail -n 1 "$submitter")" == 'main "$@"' ]] ||
  {
    echo "submit_phases.sh: $submitter no longer ends with 'main \"\$@\"'; update this script" >&2
    exit 1
  }
grep -q "^HPC_FILES_DIR=$project_root/hpc_files$" <<<"$source_text" ||
  {
    echo "submit_phases.sh: cannot find the HPC_FILES_DIR line in $submitter" >&2
    exit 1
  }
# The submitter's own code (it sets -euo pipefail itself).
eval "$source_text"
printf '%s\t%s\n' "load_libraries" "$((${EPOCHREALTIME/./} - t_script_start))" >>"$BENCH_PHASES"

# Every function main() calls: the first word of each line of its body.
mapfile -t main_steps < <(declare -f main | sed -n 's/^ *\(\[\[[^]]*\]\] *|| *\)\{0,1\}\([a-z_][a-z_0-9]*\).*/\2/p' | sort -u)
for fn in "${main_steps[@]}" "${NESTED_PHASES[@]}"; do
  case "$fn" in
    git | sbatch) wrap_command "$fn" ;;
    main | local | return | trap | printf | echo | exit) ;;
    *) wrap_function "$fn" ;;
  esac
done
wrap_function main
main "$@"
