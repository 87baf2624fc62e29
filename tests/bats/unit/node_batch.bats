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

@test "requeue_or_stop: scontrol requeue survives the TERM that requeueing sends to the job" {
  # This scontrol gets the TERM during 'requeue', as when SLURM requeues the
  # running job whose batch shell runs it.
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
if [[ "$1" == requeue ]]; then
  kill -TERM $$
  sleep 0.2
  echo "requeue done" >&2
  exit 0
fi
echo "JobId=77 JobState=RUNNING Reason=None Requeue=1"
STUB
  chmod +x "$bin/scontrol"
  HPC_MAX_REQUEUES=3 SLURM_RESTART_COUNT=0 signal_seen=USR1 run requeue_or_stop
  assert_success
  assert_output --partial 'requeue done'
  assert_output --partial 'hpc: requeued 77 (restart 1 of at most 3)'
}
