#!/usr/bin/env bats
# hpc_files/lib/submit.sh: the log path it reports, the job states --wait
# reads (scontrol stubbed), and when --wait stops.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
HPC_PROG=job_submitter.sh
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/submit.sh
source "$HPC_FILES_DIR/lib/submit.sh"

# stub_scontrol LINE...: 'scontrol show job -o' prints these lines.
stub_scontrol() {
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  printf '%s\n' "$@" >"$BATS_TEST_TMPDIR/scontrol.out"
  printf '#!/usr/bin/env bash\ncat "%s"\n' "$BATS_TEST_TMPDIR/scontrol.out" >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  PATH="$bin:$PATH"
}

@test "log_path: a project name with '&' stays as it is (bash 5.2 reads & in a replacement)" {
  plan_log_dir='/s/a&b/hpc_outputs'
  plan_job_name='a&b_exp'
  plan_log_name=%x_%j.out
  run log_path 17
  assert_output '/s/a&b/hpc_outputs/a&b_exp_17.out'
  plan_log_name=%x_%A_%a.out
  run log_path 17
  assert_output '/s/a&b/hpc_outputs/a&b_exp_17_<task>.out'
}

@test "job_states: state and exit code of every array task" {
  stub_scontrol 'JobId=5 ArrayJobId=5 ArrayTaskId=0 JobState=COMPLETED Reason=None ExitCode=0:0 RunTime=1' \
    'JobId=6 ArrayJobId=5 ArrayTaskId=1 JobState=FAILED Reason=NonZeroExitCode ExitCode=7:0 RunTime=1' \
    'JobId=7 ArrayJobId=5 ArrayTaskId=2 JobState=REQUEUE_HOLD Reason=JobHeldAdmin ExitCode=0:15 RunTime=1'
  run job_states 5
  assert_output 'COMPLETED 0:0
FAILED 7:0
REQUEUE_HOLD 0:15'
}

@test "wait_for_job ends on a job held after a requeue, says how to release it, exits non-zero" {
  stub_scontrol 'JobId=9 JobName=x JobState=REQUEUE_HOLD Reason=JobHeldAdmin ExitCode=0:0 RunTime=1'
  job_id=9
  plan_array_spec=""
  plan_log_dir=$BATS_TEST_TMPDIR
  plan_log_name=%x_%j.out
  plan_job_name=x
  run --separate-stderr timeout 10 bash -c "$(declare -f wait_for_job job_states job_records record_field is_final_state log_path info warn die one_line); HPC_PROG=job_submitter.sh; $(declare -p job_id plan_array_spec plan_log_dir plan_log_name plan_job_name); wait_for_job"
  assert_failure 1
  [[ "$stderr" == *"job 9 is held after a requeue; it runs again only after: scontrol release 9"* ]] || fail "stderr: $stderr"
}
