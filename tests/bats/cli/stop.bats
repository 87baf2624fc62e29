#!/usr/bin/env bats
# hpc_files/stop.sh with squeue and scancel stubbed: what it cancels (every
# job of the experiment, found by EXP or by one of its job ids), the stop
# record it writes, and its refusals (exit 2, one line). No cluster needed.

load '../test_helper'
load 'cli_helper'

STOP="$REPO_ROOT/hpc_files/stop.sh"

setup() {
  cli_setup
  # scancel logs its argv and empties squeue's listing, as a cancel does.
  export STUB_SCANCEL_LOG="$BATS_TEST_TMPDIR/scancel.log"
  cat >"$BATS_TEST_TMPDIR/stub-bin/scancel" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$STUB_SCANCEL_LOG"
: >"$STUB_SQUEUE_OUT"
STUB
  chmod +x "$BATS_TEST_TMPDIR/stub-bin/scancel"
  sub="$SCRATCH/$PROJECT/search/20260101-000000-abcd"
  mkdir -p "$sub" "$SCRATCH/$PROJECT/search/20260101-000100-efgh" "$SCRATCH/$PROJECT/other/20260101-000000-wxyz"
  echo 11 >"$sub/job_id"
  echo 12 >"$sub/bayes_controller_job_id"
  echo 10 >"$sub/setup_job_id"
  echo 13 >"$SCRATCH/$PROJECT/search/20260101-000100-efgh/job_id"
  echo 20 >"$SCRATCH/$PROJECT/other/20260101-000000-wxyz/job_id"
  printf '%s\n' "11|RUNNING|${PROJECT}_search" "12|PENDING|${PROJECT}_search_bayes" "10|COMPLETING|${PROJECT}_search_setup_venv" \
    "13|PENDING|${PROJECT}_search" "14|PENDING|${PROJECT}_search" "20|RUNNING|${PROJECT}_other" >"$STUB_SQUEUE_OUT"
}

# refuse_stop EXPECTED ARG...: stop.sh ARG... exits 2 with one line naming EXPECTED; nothing cancelled.
refuse_stop() {
  local expected=$1
  shift
  run --separate-stderr "$STOP" "$@"
  assert_failure 2
  [[ "$stderr" == "stop.sh: error: "*"$expected"* && "$stderr" != *$'\n'* ]] || fail "stderr: $stderr"
  assert_not_exist "$STUB_SCANCEL_LOG"
}

@test "stop.sh EXP cancels every queued or running job of the experiment and records the stop" {
  run --separate-stderr "$STOP" search
  assert_success
  assert_output "Stopped experiment search: cancelled job(s) 11,12,13,14; recorded in $SCRATCH/$PROJECT/search/stopped"
  run cat "$STUB_SCANCEL_LOG"
  assert_output -- "-- 11 12 13 14"
  assert_file_contains "$SCRATCH/$PROJECT/search/stopped" '^stopped .* by stop.sh search$'
  assert_not_exist "$SCRATCH/$PROJECT/other/stopped"
}

@test "stop.sh JOBID (or JOBID_TASK) stops the experiment whose submission recorded that job" {
  run --separate-stderr "$STOP" 12
  assert_success
  assert_output --partial "Stopped experiment search: cancelled job(s) 11,12,13,14"
  echo 1 >"$STUB_SQUEUE_OUT"
  run --separate-stderr "$STOP" 20_3
  assert_success
  assert_output "Stopped experiment other: no job of it was queued or running; recorded in $SCRATCH/$PROJECT/other/stopped"
}

@test "stop.sh --help names every option it parses; bad input is refused with one line" {
  run "$STOP" --help
  assert_success
  assert_output --partial "Usage: stop.sh EXP|JOBID"
  assert_output --partial "-h, --help"
  refuse_stop "expected an experiment name or a job id"
  refuse_stop "unknown option '--all'" --all
  refuse_stop "no experiment 'nothing' in" nothing
  refuse_stop "no experiment '../x' in" ../x
  refuse_stop "expected one experiment or job id, got 'search' and 'other'" search other
  refuse_stop "no submission of project '$PROJECT' recorded job 99" 99
}

@test "stop.sh: a job still listed after the first scancel is cancelled again and named once" {
  cat >"$BATS_TEST_TMPDIR/stub-bin/scancel" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$STUB_SCANCEL_LOG"
# The first cancel leaves job 11 running a moment longer.
if [[ $(wc -l <"$STUB_SCANCEL_LOG") -eq 1 ]]; then echo "11|RUNNING|x" >"$STUB_SQUEUE_OUT"; else : >"$STUB_SQUEUE_OUT"; fi
STUB
  run --separate-stderr "$STOP" search
  assert_success
  assert_output "Stopped experiment search: cancelled job(s) 11,12,13,14; recorded in $SCRATCH/$PROJECT/search/stopped"
  run cat "$STUB_SCANCEL_LOG"
  assert_output -- "-- 11 12 13 14
-- 11"
}
