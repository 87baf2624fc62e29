#!/usr/bin/env bats
# hpc_files/status.sh on fabricated submission folders and logs (no cluster):
# which submission it picks, task rows from the logs or from one scontrol
# call, a requeued task's restart, --watch only on a terminal, and refusals.

load '../test_helper'
load 'cli_helper'

STATUS="$REPO_ROOT/hpc_files/status.sh"

setup() {
  fabricated_submissions
}

@test "-h and --help print the usage and exit 0, without SCRATCH" {
  local spelling
  for spelling in -h --help; do
    run --separate-stderr env -u SCRATCH "$STATUS" grid "$spelling"
    assert_success
    assert_line --index 0 'usage: status.sh [EXP | JOBID] [--watch [SECONDS]] [--project NAME]'
    assert_output --partial "(default: $project,"
    assert_equal "$stderr" ""
  done
}

@test "--help lists every option the parser accepts" {
  local opts opt
  opts=$(sed -n '/^def cmd_status/,/^def /p' "$REPO_ROOT/hpc_files/hpc_tools/status.py" | grep -oE '"--?[a-z][a-z-]*"' | tr -d '"' | sort -u)
  [[ -n "$opts" ]] || fail "no options found in cmd_status"
  run "$STATUS" --help
  for opt in $opts; do
    assert_output --partial "  $opt"
  done
}

@test "with SLURM done with the job, rows come from the logs: the requeued task shows 1 restart, the failed one its exit code" {
  run --separate-stderr "$STATUS"
  assert_success
  assert_line --index 0 "grid  $SCRATCH/$project/grid/20261123-120000-new2"
  assert_line --index 1 'job 500, 8 task(s); states from logs'
  assert_line --index 2 --regexp '^task +state +restarts +elapsed +peak mem +progress$'
  assert_line --index 5 --regexp '^2 +finished +1 +00:00:42 +- +step 40/47 epoch 0 loss 0\.4000$'
  assert_line --index 8 --regexp '^5 +failed \(exit 3\) +0 +00:00:42 +- +step 20/47 epoch 0 loss 0\.5000$'
  assert_equal "${#lines[@]}" 11
  # One scontrol call and one sacct call for the whole array.
  run cat "$SCONTROL_LOG"
  assert_output 'show job -o 500'
  run cat "$SACCT_LOG"
  assert_output '-n -P -D -j 500 -o JobID,State,ExitCode,Elapsed,MaxRSS'
}

@test "while SLURM knows the job: its states and restarts, one scontrol call for every task" {
  cat >"$SCONTROL_OUT" <<'OUT'
JobId=501 ArrayJobId=500 ArrayTaskId=3-7%2 ArrayTaskThrottle=2 JobName=x JobState=PENDING Reason=JobArrayTaskLimit Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:10:00
JobId=502 ArrayJobId=500 ArrayTaskId=2 JobName=x JobState=RUNNING Reason=None Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 RunTime=00:01:05 TimeLimit=00:10:00
JobId=503 ArrayJobId=500 ArrayTaskId=1 JobName=x JobState=FAILED Reason=NonZeroExitCode Requeue=1 Restarts=0 BatchFlag=1 ExitCode=3:0 RunTime=00:00:09 TimeLimit=00:10:00
JobId=500 ArrayJobId=500 ArrayTaskId=0 JobName=x JobState=COMPLETED Reason=None Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:30 TimeLimit=00:10:00
OUT
  run --separate-stderr "$STATUS" 500
  assert_success
  assert_line --index 1 'job 500, 8 task(s); states from SLURM'
  assert_line --index 3 --regexp '^0 +COMPLETED +0 +00:00:30 '
  assert_line --index 4 --regexp '^1 +FAILED \(exit 3\) +0 +00:00:09 '
  assert_line --index 5 --regexp '^2 +RUNNING +1 +00:01:05 +- +step 40/47 epoch 0 loss 0\.4000$'
  assert_equal "$(grep -cE '^[3-7] +PENDING ' <<<"$output")" 5
  run cat "$SCONTROL_LOG"
  assert_output 'show job -o 500'
}

@test "EXP picks that experiment's newest submission; a job id picks its own" {
  run "$STATUS" single
  assert_success
  assert_line --index 1 'job 600, 1 task(s); states from logs'
  assert_line --index 3 --regexp '^0 +finished +0 '
  run "$STATUS" 400
  assert_success
  assert_line --index 0 "grid  $SCRATCH/$project/grid/20261122-090000-old1"
  # An array task's id (squeue's 500_3) names its array's submission.
  run "$STATUS" 500_3
  assert_success
  assert_line --index 1 'job 500, 8 task(s); states from logs'
}

@test "--watch refuses a stdout that is not a terminal; on a terminal it clears and redraws" {
  run --separate-stderr "$STATUS" grid --watch 1
  assert_failure 2
  assert_output ''
  assert_equal "$stderr" 'status.sh: error: --watch redraws a terminal; stdout is not one (drop --watch)'
  command -v script >/dev/null || skip "no 'script' to give it a terminal"
  # Until it has drawn twice (a loaded machine takes seconds a draw), then
  # ended as a closed terminal ends it.
  local out="$BATS_TEST_TMPDIR/watch.out" deadline=$((SECONDS + 60)) pid clears draws
  : >"$out"
  script -qec "$(printf '%q ' "$STATUS" grid --watch 1)" /dev/null >>"$out" 2>&1 &
  pid=$!
  while (($(grep -c '^task ' "$out" || true) < 2 && SECONDS < deadline)); do
    sleep 0.2
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" || true
  clears=$(grep -c $'\e\[H\e\[2J' "$out" || true)
  draws=$(grep -c '^task ' "$out" || true)
  ((draws >= 2)) || fail "not redrawn within 60 s: $(cat -v "$out")"
  # Each draw follows a clear; the last clear may lack its draw (ended between).
  ((clears == draws || clears == draws + 1)) || fail "$clears clears for $draws draws: $(cat -v "$out")"
}

@test "refusals: exit 2, one line on stderr, nothing on stdout" {
  local cases=(
    "unknown option '--bogus' (see --help)|--bogus"
    "--watch expects seconds > 0, got '0'|--watch=0"
    "unexpected argument 'two'|grid;two"
    "no experiment or job id '\$(touch x)' under $SCRATCH/$project (experiments: configs, grid, single)|\$(touch x)"
  )
  local case expected args
  for case in "${cases[@]}"; do
    expected=${case%%|*}
    IFS=";" read -ra args <<<"${case#*|}"
    run --separate-stderr "$STATUS" "${args[@]}"
    assert_failure 2
    assert_output ''
    assert_equal "$stderr" "status.sh: error: $expected"
  done
  assert_file_not_exists x
  run --separate-stderr env -u SCRATCH "$STATUS"
  assert_failure 2
  assert_equal "$stderr" 'status.sh: error: SCRATCH is not set (the folder job_submitter.sh writes under)'
}

@test "status.sh and results.sh run the python the submitter runs (HPC_PYTHON first)" {
  local stub="$BATS_TEST_TMPDIR/my python/python"
  mkdir -p "${stub%/*}"
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$@"\n' >"$stub"
  chmod +x "$stub"
  HPC_PYTHON=$stub run --separate-stderr "$STATUS" grid
  assert_success
  assert_equal "$output" "$(printf '%s\n' -m hpc_tools.results status --project "$project" grid)"
  HPC_PYTHON=$stub run --separate-stderr "$REPO_ROOT/hpc_files/results.sh" grid --no-group
  assert_success
  assert_equal "$output" "$(printf '%s\n' -m hpc_tools.results results --project "$project" grid --no-group)"
}
