#!/usr/bin/env bats
# hpc_files/node/shared.sh: what the login node and the compute nodes both
# read (SLURM's job records, a data tarball's .meta), with scontrol stubbed.
# test_helper sources the file; each test sources it again, as a script would.

load '../test_helper'

setup() {
  # shellcheck source=../../../hpc_files/node/shared.sh
  source "$REPO_ROOT/hpc_files/node/shared.sh"
  bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  PATH="$bin:$PATH"
}

# scontrol_says LINE...: 'scontrol show job -o JOB' prints these lines (and
# logs its argv); any other scontrol call fails.
scontrol_says() {
  printf '%s\n' "$@" >"$BATS_TEST_TMPDIR/scontrol.out"
  cat >"$bin/scontrol" <<STUB
#!/usr/bin/env bash
printf '%s\n' "\$*" >>"$BATS_TEST_TMPDIR/scontrol.log"
[[ "\$1 \$2 \$3" == "show job -o" ]] || exit 1
cat "$BATS_TEST_TMPDIR/scontrol.out"
STUB
  chmod +x "$bin/scontrol"
}

# scontrol_forgot: slurmctld no longer knows the job.
scontrol_forgot() {
  printf '#!/usr/bin/env bash\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n' >"$bin/scontrol"
  chmod +x "$bin/scontrol"
}

@test "job_records: every line scontrol prints for the job, asked with -o and the job id" {
  scontrol_says 'JobId=5 ArrayTaskId=0 JobState=COMPLETED' 'JobId=6 ArrayTaskId=1 JobState=RUNNING'
  run job_records 5_0
  assert_success
  assert_output $'JobId=5 ArrayTaskId=0 JobState=COMPLETED\nJobId=6 ArrayTaskId=1 JobState=RUNNING'
  assert_equal "$(cat "$BATS_TEST_TMPDIR/scontrol.log")" "show job -o 5_0"
}

@test "job_record: the first line only; nothing (and no error) once the job is forgotten" {
  scontrol_says 'JobId=5 ArrayTaskId=0 JobState=COMPLETED' 'JobId=6 ArrayTaskId=1 JobState=RUNNING'
  run job_record 5
  assert_output 'JobId=5 ArrayTaskId=0 JobState=COMPLETED'
  scontrol_forgot
  run --separate-stderr job_record 5
  assert_success
  assert_output ''
  assert_equal "$stderr" ''
}

@test "record_field: whole fields only, first or last in the line" {
  local record='JobId=7 OrigJobState=RUNNING JobState=REQUEUE_HOLD Reason=JobHeldAdmin Restarts=12 ExitCode=0:15'
  run record_field "$record" JobState
  assert_success
  assert_output REQUEUE_HOLD
  run record_field "$record" ExitCode
  assert_output 0:15
  run record_field "$record" JobId
  assert_output 7
  run record_field "$record" Restarts
  assert_output 12
  # 'Job' is the tail of no field name here; 'State' is part of one only.
  run record_field "$record" State
  assert_failure 1
  assert_output ''
  run record_field "$record" Nope
  assert_failure 1
  assert_output ''
  run record_field '' JobState
  assert_failure 1
  assert_output ''
}

@test "record_field: a field with an empty value is there, and empty" {
  run record_field 'JobId=7 Comment= JobState=PENDING' Comment
  assert_success
  assert_output ''
}

@test "job_state: the state of the job's first record; '' once the job is forgotten" {
  scontrol_says 'JobId=9 JobName=x JobState=PENDING Reason=BeginTime Restarts=1' 'JobId=10 JobName=x JobState=RUNNING'
  run job_state 9
  assert_success
  assert_output PENDING
  scontrol_says 'JobId=9 JobName=JobState=FAKE JobState=RUNNING'
  run job_state 9
  assert_output RUNNING
  scontrol_forgot
  run job_state 9
  assert_success
  assert_output ''
}

@test "is_final_state: ended and held states are final; pending, running, requeued are not" {
  local state
  for state in COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY BOOT_FAIL DEADLINE PREEMPTED SPECIAL_EXIT REQUEUE_HOLD; do
    is_final_state "$state" || fail "$state is not final"
  done
  for state in PENDING RUNNING REQUEUED REQUEUE_FED CONFIGURING COMPLETING SUSPENDED RESIZING '' completed; do
    ! is_final_state "$state" || fail "'$state' is final"
  done
}

@test "meta_value: the value of a key of the tarball's .meta, '' for a missing key; fails on a missing file" {
  local meta="$BATS_TEST_TMPDIR/data dir/data-1.tar.meta"
  mkdir -p "${meta%/*}"
  printf 'tarball_bytes=10240\ncontent_bytes=6\n' >"$meta"
  run meta_value "$meta" tarball_bytes
  assert_success
  assert_output 10240
  run meta_value "$meta" content_bytes
  assert_output 6
  run meta_value "$meta" bytes
  assert_output ''
  # No newline after the last line; a key that is the prefix of another.
  printf 'content_bytes_x=1\ncontent_bytes=7' >"$meta"
  run meta_value "$meta" content_bytes
  assert_output 7
  run meta_value "$BATS_TEST_TMPDIR/none.meta" tarball_bytes
  assert_failure
}
