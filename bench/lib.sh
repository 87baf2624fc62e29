# shellcheck shell=bash
# Helpers shared by the shell benchmarks in bench/: clocks, samples files,
# the page cache, the load, SLURM clean-up. Sourced; defines functions only.
#
# Samples are 'config<TAB>rep<TAB>seconds' lines; bench/benchstats.py turns
# them into Markdown tables with medians, ranges and paired ratios.

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_PY=${BENCH_PY:-$BENCH_ROOT/.venv/bin/python}
[[ -x "$BENCH_PY" ]] || BENCH_PY=python3

bench_die() {
  printf '%s: error: %s\n' "${0##*/}" "$*" >&2
  exit 1
}

bench_note() {
  printf '%s: %s\n' "${0##*/}" "$*" >&2
}

# now: seconds since the epoch, microsecond resolution (bash 5 EPOCHREALTIME).
now() {
  printf '%s' "${EPOCHREALTIME/,/.}"
}

# since T0: seconds elapsed since T0 (a 'now' value), 6 decimals.
since() {
  awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.6f", b - a }'
}

# diff_s T0 T1: T1 - T0 in seconds.
diff_s() {
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", b - a }'
}

# record FILE CONFIG REP SECONDS: one sample.
record() {
  printf '%s\t%s\t%s\n' "$2" "$3" "$4" >>"$1"
}

# loadavg: the three load averages.
loadavg() {
  cut -d' ' -f1-3 /proc/loadavg
}

# drop_caches: write back dirty pages and drop the page cache; fails (1)
# where the kernel does not let us (not root, read-only /proc/sys).
drop_caches() {
  sync
  { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null
}

# md_table SAMPLES COMMANDS ANCHOR [ORDER] [UNIT]: the Markdown table.
md_table() {
  "$BENCH_PY" "$BENCH_ROOT/bench/benchstats.py" table "$1" --commands "$2" \
    --anchor "$3" --order "${4:-}" --unit "${5:-s}"
}

# median SAMPLES CONFIG
median() {
  "$BENCH_PY" "$BENCH_ROOT/bench/benchstats.py" median "$1" "$2"
}

# Job ids this benchmark submitted; cancel_submitted cancels them all and
# waits until none is pending or running.
BENCH_JOBS=()

track_job() {
  [[ "$1" =~ ^[0-9]+$ ]] && BENCH_JOBS+=("$1")
}

cancel_submitted() {
  local tries=0 left
  ((${#BENCH_JOBS[@]} > 0)) || return 0
  scancel "${BENCH_JOBS[@]}" 2>/dev/null || true
  while ((tries < 100)); do
    left=$(squeue -h -j "$(
      IFS=,
      echo "${BENCH_JOBS[*]}"
    )" -t PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED 2>/dev/null | wc -l)
    ((left == 0)) && return 0
    sleep 0.2
    tries=$((tries + 1))
  done
  bench_note "warning: $left submitted job(s) still listed by squeue after scancel"
}

# need_cluster: SLURM_CONF set and the controller answering.
need_cluster() {
  export SLURM_CONF=${SLURM_CONF:-$BENCH_ROOT/.cluster/etc/slurm.conf}
  scontrol ping >/dev/null 2>&1 ||
    bench_die "the local cluster does not answer (SLURM_CONF=$SLURM_CONF); start it: local_cluster/cluster.sh up"
}

# job_state ID: the job's state as squeue shows it (empty once it left squeue).
job_state() {
  squeue -h -j "$1" -o %T 2>/dev/null | head -n 1
}

# wait_job_gone ID [SECONDS]: until the job is no longer pending or running.
wait_job_gone() {
  local id=$1 limit=${2:-120} t0 state
  t0=$SECONDS
  while ((SECONDS - t0 < limit)); do
    state=$(job_state "$id")
    case "$state" in
      "" | COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;;
    esac
    sleep 0.2
  done
  return 1
}

# bench_site_file FILE: the local site profile plus a line that prints the
# job's start time (microseconds) at the top of the batch script.
bench_site_file() {
  {
    cat "$BENCH_ROOT/hpc_files/sites/local.conf"
    # shellcheck disable=SC2016 # expanded in the job, not here
    printf '%s\n' 'command = echo "bench: job start ${EPOCHREALTIME/,/.}"'
  } >"$1"
}

# file_mtime FILE: modification time with sub-second precision.
file_mtime() {
  stat -c %.6Y "$1"
}

# bench_usage: the calling script's header comment (its help text).
bench_usage() {
  awk 'NR > 1 && /^#/ { if ($0 !~ /shellcheck/) { sub(/^# ?/, ""); print }; next } NR > 1 { exit }' "$0"
}

# round_order ROUND CONFIG...: the configurations in the order round ROUND
# runs them: as given on even rounds, reversed on odd ones (A B C, C B A, ...),
# so no configuration always follows the same one (the page cache, the disk's
# write-back and the scheduler carry state from one run into the next).
round_order() {
  local round=$1 i
  shift
  if ((round % 2 == 0)); then
    printf '%s\n' "$@"
  else
    for ((i = $#; i > 0; i--)); do printf '%s\n' "${!i}"; done
  fi
}

# make_user_project DIR FILES: a user's project as the submitter sees it: the
# toolkit's folders plus FILES small Python sources, in git with one commit
# (the code snapshot of every submission archives them all).
make_user_project() {
  local dir=$1 files=$2 i
  mkdir -p "$dir/src"
  cp -r "$BENCH_ROOT/hpc_files" "$BENCH_ROOT/virtual_env_hpc_files" "$BENCH_ROOT/singularity_hpc_files" "$dir/"
  for ((i = 0; i < files; i++)); do
    printf 'VALUE = %d\n' "$i" >"$dir/src/module_$i.py"
  done
  git -C "$dir" init -q
  git -C "$dir" add -A
  git -C "$dir" -c user.name=bench -c user.email=bench@localhost commit -q -m project
}
