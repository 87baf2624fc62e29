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
