#!/usr/bin/env bats
# hpc_files/node/batch.sh's functions, loaded without running main, with
# scontrol stubbed.

load '../test_helper'

setup() {
  # batch.sh minus its last line ('main "$@"'), beside the lib.sh it sources.
  local node="$BATS_TEST_TMPDIR/node"
  mkdir -p "$node"
  cp "$REPO_ROOT"/hpc_files/node/*.sh "$node/"
  sed '$d' "$REPO_ROOT/hpc_files/node/batch.sh" >"$node/batch_functions.sh"
  # shellcheck source=/dev/null
  source "$node/batch_functions.sh"
  export SLURM_JOB_ID=77
  bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  PATH="$bin:$PATH"
}

# scontrol_says LINE: 'scontrol show job -o' prints LINE.
scontrol_says() {
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" %q\n' "$1" >"$bin/scontrol"
  chmod +x "$bin/scontrol"
}

@test "requeue_already_requested: a running job is not, whatever its Requeue=1 flag says" {
  scontrol_says 'JobId=77 JobName=x JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0'
  run requeue_already_requested
  assert_failure
}

@test "requeue_already_requested: REQUEUED, REQUEUE_HOLD or PENDING again means someone requeued it" {
  local state
  for state in REQUEUED REQUEUE_HOLD PENDING; do
    scontrol_says "JobId=77 JobName=x JobState=$state Reason=BeginTime Requeue=1 Restarts=1"
    run requeue_already_requested
    assert_success
  done
}
