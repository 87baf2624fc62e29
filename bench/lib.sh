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

# SLURM's record of a job, read as the toolkit reads it: job_state ID (''
# once slurmctld forgot the job) and is_final_state STATE.
# shellcheck source=../hpc_files/node/shared.sh
source "$BENCH_ROOT/hpc_files/node/shared.sh"

# wait_job_gone ID [SECONDS]: until the job is over (or forgotten).
wait_job_gone() {
  local id=$1 limit=${2:-120} t0 state
  t0=$SECONDS
  while ((SECONDS - t0 < limit)); do
    state=$(job_state "$id")
    [[ -n "$state" ]] && ! is_final_state "$state" || return 0
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

# run_rounds FUNCTION CONFIG...: 'FUNCTION CONFIG ROUND' for every round in
# rounds (bench_options) and every CONFIG, in round_order.
run_rounds() {
  local fn=$1 r c
  shift
  for r in "${rounds[@]}"; do
    for c in $(round_order "$r" "$@"); do
      "$fn" "$c" "$r"
    done
    bench_note "round $r done"
  done
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

# The preamble every shell benchmark shares: options, work dir, clean-up,
# site file, data set. Each sets globals the calling script reads.

# bench_options DEFAULT_REPS ARG...: the options every benchmark takes
# (--smoke, --reps N, --out FILE, -h); sets reps, smoke ("" or 1), out, and
# rounds: the rounds to run, a discarded warm-up (-1) first unless --smoke.
bench_options() {
  local r
  reps=$1
  smoke=""
  out=""
  shift
  while (($# > 0)); do
    case "$1" in
      --smoke) smoke=1 reps=1 ;;
      --reps) reps=${2:?--reps expects a number} && shift ;;
      --out) out=${2:?--out expects a file} && shift ;;
      -h | --help) bench_usage && exit 0 ;;
      *) bench_die "unknown option '$1'" ;;
    esac
    shift
  done
  rounds=()
  [[ -n "$smoke" ]] || rounds+=(-1)
  for ((r = 0; r < reps; r++)); do rounds+=("$r"); done
}

# warmup_note: how the rounds began, for the section's text.
warmup_note() {
  if [[ -n "$smoke" ]]; then echo 'no warm-up (smoke)'; else echo 'one discarded warm-up round'; fi
}

# bench_workdir NAME [PARENT]: a fresh folder in work (PARENT defaults to
# /var/tmp), removed at exit after the jobs this benchmark submitted are
# cancelled and the FUSE mount at bench_mount (if any) is unmounted.
bench_mount=""
bench_workdir() {
  work=$(mktemp -d "${2:-/var/tmp}/bench-$1.XXXXXX") || bench_die "mktemp failed"
  trap bench_cleanup EXIT
}

bench_cleanup() {
  cancel_submitted
  if [[ -n "$bench_mount" ]] && mountpoint -q "$bench_mount" 2>/dev/null; then
    fusermount -u "$bench_mount" 2>/dev/null || umount "$bench_mount" 2>/dev/null || true
  fi
  rm -rf -- "${work:?}"
}

# bench_harness_job_setup: what the benchmarks that run hpc_harness.train
# through the submitter need: project (this repository's name), SCRATCH in
# work, site (the local profile that prints the job's start time) and the
# example's data set, written once up front (not part of what is measured).
bench_harness_job_setup() {
  project=${BENCH_ROOT##*/}
  export SCRATCH="$work/scratch"
  site="$work/bench_site.conf"
  bench_site_file "$site"
  PYTHONPATH="$BENCH_ROOT" "$BENCH_PY" -c 'import sys; from hpc_harness.data import ensure_digits; ensure_digits(sys.argv[1])' \
    "$SCRATCH/$project/datasets/digits"
}

# bench_section TEXT: the benchmark's Markdown section, to --out (if given) and stdout.
bench_section() {
  [[ -z "$out" ]] || printf '%s\n' "$1" >"$out"
  printf '%s\n' "$1"
}
