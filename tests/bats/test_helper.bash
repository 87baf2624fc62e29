# shellcheck shell=bash disable=SC2034 # SUBMITTER, FIXTURES, ... are read by the .bats files that load this
# Shared by every .bats file: `load '../test_helper'` (from a subfolder).
# Loads bats-support/assert/file, names the repository's scripts, and gives
# integration tests bounded waits on the local cluster and a bitwise
# comparison of final weights.

bats_require_minimum_version 1.5.0

# bats sources this file again for every test, so it forks nothing: the
# libraries' load.bash files run one 'dirname' per source line (17 forks, a
# third of an empty test's cost); their src/ files are sourced here instead,
# which is all that load.bash does.
BATS_LIB_DIR="${BATS_LIB_DIR:-/usr/lib/bats}"
for bats_lib_file in "$BATS_LIB_DIR"/bats-support/src/*.bash "$BATS_LIB_DIR"/bats-assert/src/*.bash \
  "$BATS_LIB_DIR"/bats-file/src/*.bash; do
  # shellcheck source=/dev/null
  source "$bats_lib_file"
done
unset bats_lib_file

REPO_ROOT="$(cd "$BATS_TEST_DIRNAME/../../.." && pwd)"
SUBMITTER="$REPO_ROOT/hpc_files/job_submitter.sh"
FIXTURES="$REPO_ROOT/tests/bats/fixtures"
export SLURM_CONF="${SLURM_CONF:-$REPO_ROOT/.cluster/etc/slurm.conf}"

# A scratch folder whose path has a space in it, as SCRATCH.
make_scratch() {
  export SCRATCH="$BATS_TEST_TMPDIR/scratch space"
  mkdir -p "$SCRATCH"
}

# A fake sbatch on PATH that records its argv (one word per line, then a
# separator) in $STUB_SBATCH_LOG and prints a job id. The submitter also asks
# scontrol for MaxArraySize before an array: answered as the local cluster
# does (without a cluster, scontrol waits on DNS), and nothing else it asks
# scontrol (the user's accounts: as a cluster without accounting, so a
# production-shaped local cluster in SLURM_CONF does not answer for it); and
# squeue for the experiment's queued jobs: none, unless a test writes
# squeue's lines ('%F|%T|%j') into $STUB_SQUEUE_OUT; sacct keeps no job; and
# sinfo cannot say the nodes' memory. No call reaches the local cluster,
# whose job ids (4242 say) are other suites' jobs. The stubs are fixtures
# (fixtures/stub-bin), so a test forks nothing for them; a test replaces one
# by writing its own into $BATS_TEST_TMPDIR/stub-bin, first on PATH.
stub_sbatch() {
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  mkdir -p "$bin"
  export STUB_SBATCH_LOG="$BATS_TEST_TMPDIR/sbatch.log"
  export STUB_SQUEUE_OUT="$BATS_TEST_TMPDIR/squeue.out"
  export PATH="$bin:$FIXTURES/stub-bin:$PATH"
}

# Fails the test unless the local cluster answers (make cluster-up starts it).
require_cluster() {
  scontrol ping >/dev/null 2>&1 ||
    fail "the local SLURM cluster is not up (SLURM_CONF=$SLURM_CONF); run 'make cluster-up'"
}

# job_record, record_field, job_state, is_final_state: read as the
# submitter, the batch script and the cleanup read them.
# shellcheck source=../../hpc_files/node/shared.sh
source "$REPO_ROOT/hpc_files/node/shared.sh"

# job_field JOB FIELD: one field of 'scontrol show job' (first record).
job_field() {
  record_field "$(job_record "$1")" "$2" || true
  printf '\n'
}

# wait_job_state JOB SECONDS STATE_REGEX: poll until the job's state matches.
wait_job_state() {
  local job=$1 seconds=$2 want=$3 deadline state=""
  deadline=$((SECONDS + seconds))
  while ((SECONDS < deadline)); do
    state=$(job_state "$job")
    [[ "$state" =~ ^($want)$ ]] && return 0
    sleep 0.5
  done
  fail "job $job did not reach state '$want' within ${seconds}s (last: '${state:-unknown}'); $(scontrol show job "$job" 2>&1 | head -n 20)"
}

# wait_job_done JOB SECONDS: poll until the job has ended (is_final_state),
# whatever the outcome.
wait_job_done() {
  local job=$1 deadline=$((SECONDS + $2)) state=""
  while ((SECONDS < deadline)); do
    state=$(job_state "$job")
    is_final_state "$state" && return 0
    sleep 0.5
  done
  fail "job $job did not end within ${2}s (last: '${state:-unknown}'); $(scontrol show job "$job" 2>&1 | head -n 20)
steps: $(squeue -h -s -j "$job" 2>&1)
log: $(job_log "$job" 2>&1 | tail -n 30)"
}

# assert_job_state JOB STATE: the job ended in STATE; otherwise fail showing
# the end of its log.
assert_job_state() {
  local job=$1 want=$2 state log
  state=$(job_state "$job")
  [[ "$state" == "$want" ]] && return 0
  log=$(scontrol show job -o "$job" | head -n 1 | sed -n 's/.* StdOut=\(.*\) Power=.*/\1/p')
  fail "job $job is $state, expected $want; $(job_field "$job" ExitCode); log $log:
$(tail -n 40 "$log" 2>&1)"
}

# cancel_test_jobs: scancel whatever this test left queued or running (its
# jobs are the ones whose working folder is under BATS_TEST_TMPDIR), so a
# failed test does not hold the cluster for the next.
cancel_test_jobs() {
  local id dir
  while read -r id dir; do
    [[ "$dir" == "$BATS_TEST_TMPDIR"/* ]] && scancel "$id" 2>/dev/null
  done < <(squeue -h -o '%A %Z' 2>/dev/null)
  return 0
}

# submit ARGS...: job_submitter.sh (site 'local' unless ARGS name another
# first) without --wait; sets job_id, and submit_err to its stderr file.
submit() {
  local out
  submit_err="$BATS_TEST_TMPDIR/submit.err"
  out=$("$SUBMITTER" --site "${TEST_SITE:-local}" "$@" 2>"$submit_err") ||
    fail "submission failed: $(cat "$submit_err")"
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  [[ -n "$job_id" ]] || fail "no job id in: $out"
}

# straight_and_interrupted OPTION... -- COMMAND...: submit COMMAND twice with
# the submitter's OPTIONs, as experiments 'straight' and 'interrupted' with
# --ckpt-dir $BATS_TEST_TMPDIR/straight and .../interrupted. Once the second
# has logged step 15 or later (mid-epoch), deliver the wall-time signal as
# SLURM does, USR1 to the batch shell; release its requeue and wait until both
# have COMPLETED. Sets straight and interrupted, the two job ids.
straight_and_interrupted() {
  local options=()
  while (($#)) && [[ "$1" != -- ]]; do
    options+=("$1")
    shift
  done
  if (($# < 2)); then
    fail "usage: straight_and_interrupted OPTION... -- COMMAND..."
    return
  fi
  shift
  submit ${options[@]+"${options[@]}"} -e straight -- "$@" --ckpt-dir "$BATS_TEST_TMPDIR/straight"
  straight=$job_id
  submit ${options[@]+"${options[@]}"} -e interrupted -- "$@" --ckpt-dir "$BATS_TEST_TMPDIR/interrupted"
  interrupted=$job_id
  wait_log "$interrupted" '^hpc_harness: step (1[5-9]|[2-9][0-9])/' 180
  scancel --signal=USR1 --batch "$interrupted"
  release_requeued "$interrupted" 1
  wait_job_done "$straight" 240
  wait_job_done "$interrupted" 240
  assert_job_state "$straight" COMPLETED
  assert_job_state "$interrupted" COMPLETED
}

# array_states JOB: 'TASK STATE' per array task, sorted by task.
array_states() {
  scontrol show job -o "$1" | sed -n 's/.* ArrayTaskId=\([0-9]*\) .* JobState=\([A-Z_]*\) .*/\1 \2/p' | sort -n
}

# wait_array_done JOB TASKS SECONDS
wait_array_done() {
  local job=$1 tasks=$2 deadline=$((SECONDS + $3)) states
  while :; do
    states=$(array_states "$job")
    if [[ "$(grep -cE ' (COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)$' <<<"$states")" == "$tasks" ]]; then
      return 0
    fi
    ((SECONDS < deadline)) || fail "array $job not done within $3 s: $states"
    sleep 0.5
  done
}

# wait_file FILE SECONDS [REGEX]: poll until FILE exists (and holds a line
# matching REGEX); otherwise fail showing the queue and the logs' last lines.
wait_file() {
  local deadline=$((SECONDS + $2))
  until [[ -e "$1" ]] && grep -qE "${3:-}" "$1"; do
    ((SECONDS < deadline)) ||
      fail "no $1 within $2 s; queue: $(squeue -h 2>&1 | head -n 10); logs: $(tail -n 5 "$SCRATCH/${REPO_ROOT##*/}/hpc_outputs/"* 2>&1 | tail -n 40)"
    sleep 1
  done
}

# job_log JOB: the job's log (all of its runs, appended).
job_log() {
  cat "$SCRATCH/${REPO_ROOT##*/}/hpc_outputs/"*"_$1.out"
}

# wait_log JOB REGEX SECONDS [COUNT]: poll the job's log until COUNT lines
# (default 1) match REGEX.
wait_log() {
  local job=$1 regex=$2 deadline=$((SECONDS + $3)) count=${4:-1}
  until (($(job_log "$job" 2>/dev/null | grep -cE "$regex") >= count)); do
    ((SECONDS < deadline)) ||
      fail "not $count line(s) matching '$regex' in job $job's log within $3 s: $(job_log "$job" 2>&1 | tail -n 20)"
    sleep 0.3
  done
}

# release_requeued JOB RESTARTS [SECONDS]: once the job is pending again after
# that requeue (wait_requeued), lift SLURM's ~120 s requeue hold.
release_requeued() {
  wait_requeued "$@"
  scontrol update JobId="$1" StartTime=now
}

# wait_requeued JOB RESTARTS [SECONDS]: until the job is pending again after
# that requeue and may be released early: not within the second of the
# requeue (slurmd compares credential times in whole seconds and would refuse
# the new launch as 'Job credential revoked'), and not while the last run's
# step daemons end (one still removing its cgroups on a loaded machine fails
# the new run's step on that node: 'Slurmd could not set up environment').
wait_requeued() {
  local job=$1 restarts=$2 deadline=$((SECONDS + ${3:-120})) requeued_at
  until [[ "$(job_field "$job" Restarts)" == "$restarts" && "$(job_state "$job")" == PENDING ]]; do
    ((SECONDS < deadline)) ||
      fail "job $job was not requeued (restart $restarts) in time: $(scontrol show job "$job" | head -n 5); log: $(job_log "$job" 2>&1 | tail -n 15)"
    sleep 0.5
  done
  requeued_at=$(date -d "$(job_field "$job" SubmitTime)" +%s)
  until (($(date +%s) >= requeued_at + 2)); do
    sleep 0.2
  done
  while pgrep -f "^slurmstepd: \[$job\." >/dev/null; do
    ((SECONDS < deadline)) || fail "job $job: the last run's step daemons did not end in time: $(pgrep -af "^slurmstepd: \[$job\.")"
    sleep 0.2
  done
}

# cluster_test_setup: what every cluster test starts with: the cluster
# answers, a SCRATCH with a space in its path, and the project's name.
cluster_test_setup() {
  require_cluster
  make_scratch
  project=${REPO_ROOT##*/}
}

# local_tmpdir_base: the 'local' site profile's node-local base for this
# cluster (SLURM_CONF), as the submitter resolves it.
local_tmpdir_base() {
  # shellcheck disable=SC2016 # expanded by the bash it starts
  bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1
    source "$HPC_FILES_DIR/lib/common.sh"
    source "$HPC_FILES_DIR/lib/options.sh"
    source "$HPC_FILES_DIR/lib/site.sh"
    find_site_file local
    read_site_file "$site_file"
    printf "%s" "$site_tmpdir_base"' _ "$REPO_ROOT/hpc_files"
}

# digits_dataset: the example's dataset, written once per .bats file; prints its path.
digits_dataset() {
  local dir="$BATS_FILE_TMPDIR/digits"
  if [[ ! -d "$dir" ]]; then
    "$REPO_ROOT/.venv/bin/python" -c 'import sys; from hpc_harness.data import write_digits; write_digits(sys.argv[1])' "$dir" >&2
  fi
  printf '%s' "$dir"
}

# assert_weights_equal A B: the checkpoints A and B (last.pt files) hold the
# same model weights, bitwise; otherwise fail naming the tensors that differ.
assert_weights_equal() {
  local differ
  if ! differ=$("$REPO_ROOT/.venv/bin/python" -c '
import sys, torch
a = torch.load(sys.argv[1], weights_only=False)["model"]
b = torch.load(sys.argv[2], weights_only=False)["model"]
if a.keys() != b.keys():
    print("tensors in one only:", *sorted(a.keys() ^ b.keys()))
else:
    print(*(k for k in a if not torch.equal(a[k], b[k])))
' "$1" "$2"); then
    fail "could not read the weights of $1 and $2"
  elif [[ -n "$differ" ]]; then
    fail "the weights of $1 and $2 differ: $differ"
  fi
}
