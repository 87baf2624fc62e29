#!/usr/bin/env bats
# A submission to an experiment with queued or running jobs (squeue stubbed):
# refused naming them and the ways out; --after-running queues behind them;
# a method-bayes round from its controller is never refused.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  stub_sbatch_recording
}

# an_earlier_submission EXP ID: a submission folder of EXP that recorded job ID.
an_earlier_submission() {
  mkdir -p "$SCRATCH/$PROJECT/$1/20260101-000000-abcd" "$SCRATCH/$PROJECT/$1/checkpoints"
  printf '%s\n' "$2" >"$SCRATCH/$PROJECT/$1/20260101-000000-abcd/job_id"
}

@test "a submission to an experiment with a queued job is refused, naming the job and the ways out" {
  an_earlier_submission busy 71
  printf '71|RUNNING|%s_busy\n' "$PROJECT" >"$STUB_SQUEUE_OUT"
  refuse "experiment 'busy' has queued or running job(s) 71" -- -e busy -C "$ONE_LINE" --venv "$FAKE_VENV"
  [[ "$stderr" == *"-e NEW"* && "$stderr" == *"--after-running"* && "$stderr" == *"hpc_files/stop.sh busy"* ]] ||
    fail "the ways out are not all named: $stderr"
}

@test "a job named for the experiment counts ('sbatch job.sbatch' by hand); another experiment's does not" {
  printf '80|PENDING|%s_hand\n81|RUNNING|%s_other\n' "$PROJECT" "$PROJECT" >"$STUB_SQUEUE_OUT"
  refuse "job(s) 80;" -- -e hand -C "$ONE_LINE" --venv "$FAKE_VENV"
  run --separate-stderr "$SUBMITTER" -e free -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
}

@test "a recorded controller and setup job count; an ending (COMPLETING) job and jobs of other experiments do not" {
  an_earlier_submission busy 71
  printf '72\n' >"$SCRATCH/$PROJECT/busy/20260101-000000-abcd/bayes_controller_job_id"
  printf '73\n' >"$SCRATCH/$PROJECT/busy/20260101-000000-abcd/setup_job_id"
  printf '71|COMPLETING|%s_busy\n72|PENDING|%s_busy_bayes\n73|RUNNING|x\n90|RUNNING|y\n' "$PROJECT" "$PROJECT" >"$STUB_SQUEUE_OUT"
  refuse "job(s) 72,73;" -- -e busy -C "$ONE_LINE" --venv "$FAKE_VENV"
}

@test "--after-running queues behind the experiment's jobs (afterany), beside --dependency" {
  an_earlier_submission busy 71
  printf '71|RUNNING|%s_busy\n75|PENDING|%s_busy\n' "$PROJECT" "$PROJECT" >"$STUB_SQUEUE_OUT"
  run --separate-stderr "$SUBMITTER" -e busy -C "$ONE_LINE" --venv "$FAKE_VENV" --after-running --dependency afterok:5 </dev/null
  assert_success
  [[ "$stderr" == *"queued behind job(s) 71,75"* ]] || fail "stderr: $stderr"
  run grep -x -- '#SBATCH --dependency=afterany:71:75,afterok:5' "$(submission_dirs busy | tail -n 1)/job.sbatch"
  assert_success
}

@test "--after-running with nothing queued submits at once" {
  run --separate-stderr "$SUBMITTER" -e calm -C "$ONE_LINE" --venv "$FAKE_VENV" --after-running </dev/null
  assert_success
  run grep -c -- '--dependency' "$(submission_dirs calm)/job.sbatch"
  assert_output 0
}

@test "a method-bayes round submitted by its controller (HPC_BAYES_ROUND) is not refused" {
  an_earlier_submission busy 71
  printf '71|RUNNING|%s_busy_bayes\n' "$PROJECT" >"$STUB_SQUEUE_OUT"
  HPC_BAYES_ROUND=2 HPC_BAYES_STUDY=s HPC_BAYES_JOURNAL="$BATS_TEST_TMPDIR/j" run --separate-stderr "$SUBMITTER" --dry-run -e busy -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
}

@test "a user's submission to a stopped experiment removes the stop record and says so" {
  mkdir -p "$SCRATCH/$PROJECT/halted/checkpoints"
  echo stopped >"$SCRATCH/$PROJECT/halted/stopped"
  run --separate-stderr "$SUBMITTER" -e halted -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
  [[ "$stderr" == *"was stopped (stop.sh); this submission starts it again"* ]] || fail "stderr: $stderr"
  assert_not_exist "$SCRATCH/$PROJECT/halted/stopped"
}

# ended_log EXP JOB TASK CODE: task TASK of array job JOB of EXP ended with exit CODE (its log).
ended_log() {
  mkdir -p "$SCRATCH/$PROJECT/hpc_outputs"
  printf 'hpc: job %s_%s (trial %s) on node1, restart 0, started 2026-11-23 12:00:00\nhpc: training step ended with exit code %s at 2026-11-23 12:00:42\n' \
    "$2" "$3" "$3" "$4" >"$SCRATCH/$PROJECT/hpc_outputs/${PROJECT}_$1_$2_$3.out"
}

@test "--retry-failed EXP reruns only the failed trials of its last submission, from the same folder, as one array" {
  run --separate-stderr "$SUBMITTER" -e retry -C "$THREE_LINES" --venv "$FAKE_VENV" --array-throttle 2 </dev/null
  assert_success
  local sub
  sub=$(submission_dirs retry)
  ended_log retry 4242 0 0
  ended_log retry 4242 1 3
  ended_log retry 4242 2 1
  : >"$STUB_SBATCH_LOG"
  : >"$STUB_SBATCH_LOG.where"
  run --separate-stderr "$SUBMITTER" --retry-failed retry </dev/null
  assert_success
  assert_output "Resubmitted trial(s) 1,2 of $sub as job 4242 (the same code snapshot and data; each in its own trial folder)"
  run cat "$STUB_SBATCH_LOG"
  assert_output -- "--parsable
--array=1,2%2
--time=00-01:00:00
--open-mode=append
--signal=B:USR1@90
--requeue
--export=ALL
job.sbatch
--"
  grep -qx 'HPC_CONTRACT_ON_COMMAND_LINE=1' "$STUB_SBATCH_LOG.env"
  assert_equal "$(head -n 1 "$STUB_SBATCH_LOG.where")" "$sub"
  assert_equal "$(cat "$sub/job_ids")" 4242
  # Nothing else was written: one submission folder still.
  assert_equal "$(submission_dirs retry)" "$sub"
}

@test "--retry-failed: nothing failed, nothing queued; --dry-run shows the sbatch; bad input is refused" {
  run --separate-stderr "$SUBMITTER" -e retry -C "$THREE_LINES" --venv "$FAKE_VENV" </dev/null
  assert_success
  ended_log retry 4242 0 0
  ended_log retry 4242 1 0
  rm -f "$STUB_SBATCH_LOG"
  export SACCT_LOG="$BATS_TEST_TMPDIR/sacct.log"
  run --separate-stderr "$SUBMITTER" --retry-failed retry </dev/null
  assert_success
  [[ "$stderr" == *"no failed trial in the last submission of 'retry'"* ]] || fail "stderr: $stderr"
  assert_not_exist "$STUB_SBATCH_LOG"
  # Accounting was asked of job 4242 once: the stub, not the local cluster's job 4242.
  assert_equal "$(cat "$SACCT_LOG")" "-n -P -D -j 4242 -o JobID,State,ExitCode,Elapsed,MaxRSS"
  ended_log retry 4242 2 9
  run --separate-stderr "$SUBMITTER" --retry-failed=retry --dry-run </dev/null
  assert_success
  assert_output --regexp "^Would rerun trial\(s\) 2 of .*/retry/20[0-9-]+-[A-Za-z0-9]+: HPC_CONTRACT_ON_COMMAND_LINE=1 sbatch --parsable --array=2 .* --export=ALL job.sbatch$"
  assert_not_exist "$STUB_SBATCH_LOG"
  refuse "--retry-failed reruns the last submission as it was written; it takes no option but --after-running and --dry-run, got --gpus" -- --retry-failed retry -g 2
  refuse "--retry-failed: no experiment 'nothing' in" -- --retry-failed nothing
  refuse "--retry-failed accepts letters, digits" -- --retry-failed '../x'
}

@test "--retry-failed refuses a method-bayes round, and an experiment with queued jobs without --after-running" {
  run --separate-stderr "$SUBMITTER" -e retry -C "$THREE_LINES" --venv "$FAKE_VENV" </dev/null
  assert_success
  ended_log retry 4242 1 3
  printf '4242|RUNNING|%s_retry\n' "$PROJECT" >"$STUB_SQUEUE_OUT"
  rm -f "$STUB_SBATCH_LOG"
  refuse "experiment 'retry' has queued or running job(s) 4242" -- --retry-failed retry
  run --separate-stderr "$SUBMITTER" --retry-failed retry --after-running </dev/null
  assert_success
  assert_line --partial "Resubmitted trial(s) 1 of"
  grep -qx -- '--dependency=afterany:4242' "$STUB_SBATCH_LOG" || fail "no dependency: $(cat "$STUB_SBATCH_LOG")"
  : >"$STUB_SQUEUE_OUT"
  echo '{}' >"$(submission_dirs retry)/bayes.json"
  rm -f "$STUB_SBATCH_LOG"
  refuse "is a round of a method-bayes search" -- --retry-failed retry
}

@test "--retry-failed of a sweep split at MaxArraySize: one array per part holding failed trials, each with its offset" {
  local bin="$BATS_TEST_TMPDIR/split-bin"
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\nprintf "MaxArraySize            = 3\\n"\n' >"$bin/scontrol"
  # sbatch answers 101, 102, ... so that the parts have their own ids.
  cat >"$bin/sbatch" <<'STUB'
#!/usr/bin/env bash
for arg in "$@"; do printf '%s\n' "$arg" >>"$STUB_SBATCH_LOG"; done
echo "--" >>"$STUB_SBATCH_LOG"
env | grep '^HPC_' >>"$STUB_SBATCH_LOG.env"
n=$(($(cat "$STUB_SBATCH_LOG.n" 2>/dev/null || echo 100) + 1))
echo "$n" >"$STUB_SBATCH_LOG.n"
echo "$n"
STUB
  chmod +x "$bin/scontrol" "$bin/sbatch"
  PATH="$bin:$PATH" run --separate-stderr "$SUBMITTER" -e split -C "$ONE_LINE" --seeds 7 --venv "$FAKE_VENV" </dev/null
  assert_success
  local sub
  sub=$(submission_dirs split)
  assert_equal "$(cat "$sub/array_jobs")" "101 0
102 3
103 6"
  # Trials 1 (part 101, task 1), 4 (102, task 1) and 5 (102, task 2) failed; the rest finished.
  ended_log split 101 0 0
  ended_log split 101 1 3
  ended_log split 101 2 0
  ended_log split 102 0 0
  ended_log split 102 1 1
  ended_log split 102 2 1
  ended_log split 103 0 0
  : >"$STUB_SBATCH_LOG"
  : >"$STUB_SBATCH_LOG.env"
  PATH="$bin:$PATH" run --separate-stderr "$SUBMITTER" --retry-failed split </dev/null
  assert_success
  assert_output "Resubmitted trial(s) 1,4,5 of $sub as job 104,105 (the same code snapshot and data; each in its own trial folder)"
  run grep -E -- '^--(array|export)=' "$STUB_SBATCH_LOG"
  assert_output -- "--array=1
--export=ALL
--array=1,2
--export=ALL"
  run grep '^HPC_TRIAL_OFFSET=' "$STUB_SBATCH_LOG.env"
  assert_output "HPC_TRIAL_OFFSET=0
HPC_TRIAL_OFFSET=3"
  assert_equal "$(cat "$sub/retry_jobs")" "104 0
105 3"
  # results.sh maps the retried tasks back to their trials: 105_1 is trial 4.
  ended_log split 104 1 0
  ended_log split 105 1 0
  ended_log split 105 2 0
  mkdir -p "$sub/runs/104_1" "$sub/runs/105_1" "$sub/runs/105_2"
  PATH="$bin:$PATH" run --separate-stderr "$REPO_ROOT/hpc_files/status.sh" split
  assert_success
  assert_equal "$(grep -cE '^[0-6] +finished' <<<"$output")" 7
}
