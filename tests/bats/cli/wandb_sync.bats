#!/usr/bin/env bats
# hpc_files/wandb_sync.sh on a fabricated experiment (no cluster): squeue and
# wandb are stand-ins on PATH (squeue says the job runs until the test says it
# ended; wandb records each call with the folder it ran in). The trigger files
# are written by wandb-osh's own hook, the syncer is wandb-osh's own loop.

load '../test_helper'

WANDB_SYNC="$REPO_ROOT/hpc_files/wandb_sync.sh"

setup() {
  make_scratch
  [[ -x "$REPO_ROOT/.venv/bin/python" ]] || fail "no .venv (make deps)"
  "$REPO_ROOT/.venv/bin/python" -c 'import wandb_osh' || fail "no wandb-osh in .venv (make deps)"
  unset HPC_PYTHON
  project=${REPO_ROOT##*/}
  exp_dir="$SCRATCH/$project/live"
  submission="$exp_dir/20261127-120000-abcd"
  mkdir -p "$submission"
  : >"$submission/job.sbatch"
  echo 101 >"$submission/job_id"
  echo 100 >"$submission/setup_job_id"
  run_folder="$exp_dir/checkpoints/wandb/offline-run-20261127_120000-r1"
  mkdir -p "$run_folder"
  : >"$run_folder/run-r1.wandb"
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  mkdir -p "$bin"
  export SQUEUE_LOG="$BATS_TEST_TMPDIR/squeue.log" JOBS_DONE="$BATS_TEST_TMPDIR/jobs.done"
  export WANDB_CALLS="$BATS_TEST_TMPDIR/wandb.calls"
  cat >"$bin/squeue" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$SQUEUE_LOG"
if [[ -e "$JOBS_DONE" ]]; then
  echo "slurm_load_jobs error: Invalid job id specified" >&2
  exit 1
fi
echo "101 RUNNING"
STUB
  # With the process that called it: wandb-osh's loop (live) or wandb_sync.py
  # itself (its last pass); synced_count tells them apart.
  cat >"$bin/wandb" <<'STUB'
#!/usr/bin/env bash
printf '%s %s %s\n' "$PPID" "$PWD" "$*" >>"$WANDB_CALLS"
STUB
  chmod +x "$bin/squeue" "$bin/wandb"
  export PATH="$bin:$PATH"
}

teardown() {
  [[ -z "${sync_pid:-}" ]] || kill "$sync_pid" 2>/dev/null || true
  [[ -z "${child:-}" ]] || kill "$child" 2>/dev/null || true
}

# trigger FOLDER: what the job's harness does after a log: a record more in
# the run's file, then its wandb-osh trigger.
trigger() {
  echo record >>"$1/run-r1.wandb"
  "$REPO_ROOT/.venv/bin/python" -c 'import sys; from hpc_harness.metrics import trigger_wandb_sync
trigger_wandb_sync(sys.argv[2], folder=sys.argv[1])' "$exp_dir/wandb_osh" "$1" 2>/dev/null
}

# wait_until SECONDS COMMAND...: poll COMMAND until it succeeds; fail after SECONDS.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || fail "not within the deadline: $*; syncer (pid ${sync_pid:-}) log: $(cat "$BATS_TEST_TMPDIR/sync.log" 2>&1); wandb calls: $(cat "$WANDB_CALLS" 2>&1)"
    sleep 0.2
  done
}

# synced_count loop|final: the 'wandb sync .' calls in the run folder from
# wandb-osh's loop (a child of wandb_sync.py, sync_pid) or from wandb_sync.py.
synced_count() {
  local ppid rest count=0
  [[ -f "$WANDB_CALLS" ]] || { echo 0; return 0; }
  while read -r ppid rest; do
    [[ "$rest" == "$run_folder sync ." ]] || continue
    if [[ "$1" == final && "$ppid" == "$sync_pid" ]] || [[ "$1" == loop && "$ppid" != "$sync_pid" ]]; then
      count=$((count + 1))
    fi
  done <"$WANDB_CALLS"
  echo "$count"
}

# loop_synced_at_least N: wandb-osh's loop made N or more syncs of the run
# (counted anew at each call: wait_until's arguments are expanded only once).
loop_synced_at_least() {
  (($(synced_count loop) >= $1))
}

no_trigger_left() {
  ! compgen -G "$exp_dir/wandb_osh/*.command" >/dev/null
}

sync_ended() {
  ! kill -0 "$sync_pid" 2>/dev/null
}

@test "-h and --help print the usage with the tmux and screen lines, and exit 0, without SCRATCH" {
  local spelling
  for spelling in -h --help; do
    run --separate-stderr env -u SCRATCH "$WANDB_SYNC" --poll bad "$spelling"
    assert_success
    assert_line --index 0 'Usage: wandb_sync.sh [options] [EXP]'
    assert_line "  tmux new -d -s sync 'bash hpc_files/wandb_sync.sh EXP'     (tmux attach -t sync)"
    assert_line "  screen -dmS sync bash hpc_files/wandb_sync.sh EXP          (screen -r sync)"
    assert_output --partial "(default: $project, the"
    assert_equal "$stderr" ""
  done
}

@test "--help lists every option the parser accepts" {
  local opts opt
  opts=$(grep -oE 'add_argument\("--?[a-z][a-z-]*"' "$REPO_ROOT/hpc_files/hpc_tools/wandb_sync.py" | grep -oE '"-.*"' | tr -d '"')
  [[ -n "$opts" ]] || fail "no options found in hpc_tools/wandb_sync.py"
  run "$WANDB_SYNC" --help
  for opt in $opts; do
    assert_output --partial "  $opt"
  done
  assert_line --regexp '^  -h, --help +this help$'
}

@test "bad input: one line, exit 2; no wandb-osh for the python: one line, exit 1" {
  run --separate-stderr "$WANDB_SYNC" live --poll 0
  assert_failure 2
  assert_equal "$stderr" "wandb_sync.sh: error: --poll expects seconds (a number above 0, at most 86400), got '0'"
  run --separate-stderr "$WANDB_SYNC" live --wait 'x$(touch pwned)'
  assert_failure 2
  assert_equal "$stderr" "wandb_sync.sh: error: --wait expects seconds (a number above 0, at most 86400), got 'x\$(touch pwned)'"
  run --separate-stderr "$WANDB_SYNC" live --bogus
  assert_failure 2
  assert_equal "$stderr" "wandb_sync.sh: error: unrecognized arguments: --bogus (see --help)"
  run --separate-stderr "$WANDB_SYNC" nope
  assert_failure 2
  assert_equal "$stderr" "wandb_sync.sh: error: no experiment 'nope' under $SCRATCH/$project (experiments: live)"
  run --separate-stderr env -u SCRATCH "$WANDB_SYNC" live
  assert_failure 2
  assert_equal "$stderr" "wandb_sync.sh: error: SCRATCH is not set (the folder job_submitter.sh writes under)"
  run --separate-stderr env HPC_PYTHON=/usr/bin/python3 "$WANDB_SYNC" live
  assert_failure 1
  assert_equal "${#stderr}" "$(head -n 1 <<<"$stderr" | wc -c | awk '{print $1 - 1}')"
  assert_regex "$stderr" "^wandb_sync.sh: error: wandb-osh is not installed for /usr/bin/python3 "
  assert_equal "$(cat "$SQUEUE_LOG" 2>/dev/null)" ""
  assert_file_not_exists pwned
}

@test "while the job runs, each trigger becomes a 'wandb sync .' in the run folder; when no job is left, one last sync, then exit 0" {
  "$WANDB_SYNC" live --poll 0.2 --wait 0.2 >"$BATS_TEST_TMPDIR/sync.log" 2>&1 3>&- &
  sync_pid=$!
  trigger "$run_folder"
  wait_until 60 loop_synced_at_least 1
  wait_until 30 no_trigger_left
  # A second log of the running job: synced again.
  trigger "$run_folder"
  wait_until 60 loop_synced_at_least 2
  wait_until 30 no_trigger_left
  run sync_ended
  assert_failure
  assert_equal "$(synced_count final)" 0
  touch "$JOBS_DONE"
  wait_until 60 sync_ended
  wait "$sync_pid" || fail "wandb_sync.sh exited $?: $(cat "$BATS_TEST_TMPDIR/sync.log")"
  # The last pass synced the run once more.
  assert_equal "$(synced_count final)" 1
  sync_pid=""
  run cat "$BATS_TEST_TMPDIR/sync.log"
  assert_line "wandb_sync.sh: no job of live is queued or running (jobs: 100 101)"
  assert_line "wandb_sync.sh: last sync of $run_folder"
  assert_line "wandb_sync.sh: done"
  # squeue was asked about the experiment's jobs: the training and the setup job.
  run sort -u "$SQUEUE_LOG"
  assert_output "--noheader --format=%i %T --jobs=100,101"
}

@test "with no job queued or running: one sync of the runs whose triggers nobody took, not of older runs; exit 0" {
  touch "$JOBS_DONE"
  local elsewhere="$BATS_TEST_TMPDIR/own run/offline-run-x"
  mkdir -p "$elsewhere"
  # A program outside the experiment's folder left a trigger that nobody took.
  trigger "$elsewhere"
  touch -d '1 hour ago' "$run_folder/run-r1.wandb" "$elsewhere/run-r1.wandb"
  run --separate-stderr "$WANDB_SYNC" live --poll 0.2
  assert_success
  assert_line "wandb_sync.sh: last sync of $elsewhere"
  refute_line --partial "$run_folder"
  run cut -d' ' -f2- "$WANDB_CALLS"
  assert_output "$elsewhere sync ."
  run no_trigger_left
  assert_success
}

# A process started with '&' ignores SIGINT (so did wandb-osh, which then
# outlived a wandb_sync.sh stopped twice); a second TERM comes while it stops.
@test "TERM, twice, to wandb_sync.sh (tmux kill-session) while the job runs also ends its wandb-osh syncer, both started in the background" {
  "$WANDB_SYNC" live --poll 0.2 >"$BATS_TEST_TMPDIR/sync.log" 2>&1 3>&- &
  sync_pid=$!
  wait_until 60 grep -q 'starting to watch' "$BATS_TEST_TMPDIR/sync.log"
  child=$(pgrep -P "$sync_pid" -f wandb_osh.cli)
  [[ -n "$child" ]] || fail "no wandb-osh child of $sync_pid: $(ps -o pid,ppid,args -e | grep -F wandb_osh)"
  kill -TERM "$sync_pid"
  sleep 0.5 # not a wait for an outcome: the second signal comes while the first is handled
  kill -TERM "$sync_pid" 2>/dev/null || true
  wait_until 60 sync_ended
  wait_until 30 eval '! kill -0 "$child" 2>/dev/null'
  sync_pid=""
  run cat "$BATS_TEST_TMPDIR/sync.log"
  assert_line --partial 'wandb_sync.sh: interrupted; the jobs go on (run it again to sync)'
  # It stopped on SIGINT, quietly, not killed after a while.
  refute_output --partial 'killed it'
  refute_output --partial Traceback
}

# readme_lines: the commands of docs/sweeps.md's "Live W&B from offline compute nodes".
readme_lines() {
  sed -n '/^## Live W&B from offline compute nodes/,/^## /p' "$REPO_ROOT/docs/sweeps.md" |
    sed -n '/^```bash$/,/^```$/p' | grep -v '^```'
}

@test "the docs' example: the submitter line renders the trigger folder; the tmux line's command is the report's and runs" {
  local submit_line tmux_line
  submit_line=$(readme_lines | grep 'job_submitter.sh')
  tmux_line=$(readme_lines | grep '^tmux new')
  [[ -n "$submit_line" && -n "$tmux_line" ]] || fail "docs example not found: $(readme_lines)"
  # The submitter line with --dry-run first, from the project's folder.
  run bash -c "cd \"\$1\" && ${submit_line/job_submitter.sh/job_submitter.sh --dry-run} </dev/null" _ "$REPO_ROOT"
  assert_success
  assert_line "export HPC_WANDB_SYNC_DIR='$SCRATCH/$project/live/wandb_osh'"
  # The syncer's command, as tmux would run it, for that experiment.
  [[ "$tmux_line" == "tmux new -d -s sync 'bash hpc_files/wandb_sync.sh live'"* ]] || fail "tmux line changed: $tmux_line"
  run bash -c 'cd "$1" && bash hpc_files/wandb_sync.sh live --help' _ "$REPO_ROOT"
  assert_success
  assert_line --index 0 'Usage: wandb_sync.sh [options] [EXP]'
}
