#!/usr/bin/env bats
# hpc_files/node/torchrun_worker.sh: one torchrun worker run as a child, its
# exit status recorded with its RANK (record_exit, lib.sh) and passed on;
# signals forwarded while it waits. Then the records as lib.sh reads them
# (exit_records, first_failure) and launch.sh's exit code under a fake
# torchrun that starts its workers as torchrun does (--no-python ARGV, one
# per rank, exit 1 when any failed).

load '../test_helper'

setup() {
  busy_loops=() started=()
  sub="$BATS_TEST_TMPDIR/sub mission"
  mkdir -p "$sub/node"
  cp "$REPO_ROOT"/hpc_files/node/*.sh "$sub/node/"
  worker="$sub/node/torchrun_worker.sh"
  export HPC_SUBMISSION_DIR="$sub" SLURM_JOB_ID=55 SLURMD_NODENAME=node7
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID SLURM_PROCID HPC_SIGNAL HPC_PASS_LOCAL_RANK
  exits="$sub/runs/55/exit"
}

# What a test left running: its busy loops, and a worker (with its program,
# which never got the signal) that would keep bats' output open.
teardown() {
  local pid
  kill -KILL ${busy_loops[@]+"${busy_loops[@]}"} 2>/dev/null || true
  for pid in ${started[@]+"${started[@]}"}; do
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# in_lib CODE: run CODE in a shell that sourced the submission's lib.sh.
in_lib() {
  run bash -c "source \"\$HPC_SUBMISSION_DIR/node/lib.sh\"; $1"
}

@test "the program's own exit code, recorded as rank<RANK> with the node; its argv, stdin and environment as given" {
  printf 'from stdin\n' >"$BATS_TEST_TMPDIR/in"
  # shellcheck disable=SC2016 # expanded by the program's shell
  RANK=3 run bash "$worker" bash -c 'printf "[%s]" "$@"; echo; cat; echo "rank=$RANK"; exit 3' _ 'two words' '$(touch pwned)' <"$BATS_TEST_TMPDIR/in"
  assert_failure 3
  assert_output $'[two words][$(touch pwned)]\nfrom stdin\nrank=3'
  assert_equal "$(cat "$exits/rank3")" "3 node7"
  assert_file_not_exists pwned
  RANK=0 run bash "$worker" true
  assert_success
  assert_equal "$(cat "$exits/rank0")" "0 node7"
}

@test "a program killed by a signal: 128+N, recorded, and no 'Killed' line of bash's" {
  RANK=1 run --separate-stderr bash "$worker" bash -c 'kill -KILL $$'
  assert_failure 137
  assert_equal "$stderr" ""
  assert_equal "$(cat "$exits/rank1")" "137 node7"
}

@test "a program killed the instant it starts: never a 'Killed' line of bash's (a race: 60 tries)" {
  # bash prints the line when it reaps the child at whatever command runs
  # then: the worker's stderr must be closed to it from the child's start on.
  local try
  for try in $(seq 60); do
    RANK=1 run --separate-stderr bash "$worker" sh -c 'kill -KILL $$'
    assert_failure 137
    [[ -z "$stderr" ]] || fail "try $try: stderr '$stderr'"
  done
}

@test "USR1 and TERM to the worker reach the program; the worker outlives them and exits with the program's code (the requeue's 42)" {
  local ready="$BATS_TEST_TMPDIR/ready" out="$BATS_TEST_TMPDIR/out"
  # The program counts the signals it gets and exits 42 once it has had
  # USR1 and TERM, half a second after the last, while more keep coming.
  # shellcheck disable=SC2016 # the program's own text
  RANK=2 bash "$worker" bash -c '
    usr1=0 term=0
    trap "usr1=\$((usr1 + 1))" USR1
    trap "term=\$((term + 1))" TERM
    : >"$1"
    until ((usr1 > 0 && term > 0)); do sleep 0.05; done
    sleep 0.5
    echo "program: usr1=$usr1 term=$term"
    exit 42' _ "$ready" >"$out" 2>&1 &
  local pid=$! status=0 i
  until [[ -e "$ready" ]]; do sleep 0.05; done
  for i in 1 2 3; do
    kill -USR1 "$pid"
    sleep 0.05
  done
  kill -TERM "$pid"
  sleep 0.1
  kill -USR1 "$pid"
  wait "$pid" || status=$?
  assert_equal "$status" 42
  run cat "$out"
  assert_output --regexp '^program: usr1=[1-9][0-9]* term=[1-9][0-9]*$'
  assert_equal "$(cat "$exits/rank2")" "42 node7"
}

# Bash 5 can lose a child's status when a trapped signal cuts 'wait' short
# just as the child ends (wait answers -1): a worker that waited so recorded
# 255 for about half of these runs. The signal goes to the worker's process
# group, as torch 2.2+ and SLURM send it, and to the worker itself.
@test "a program that exits 42 at the signal's instant: 42 every time, never a status lost to the signal" {
  local ready="$BATS_TEST_TMPDIR/ready" i pid status
  for i in $(seq 10); do
    rm -f "$ready"
    # shellcheck disable=SC2016 # the program's own text
    RANK=0 setsid bash "$worker" bash -c 'trap "exit 42" USR1; : >"$1"; while :; do sleep 0.01; done' _ "$ready" \
      >/dev/null 2>&1 &
    pid=$!
    until [[ -e "$ready" ]]; do sleep 0.01; done
    kill -USR1 -- "-$pid"
    kill -USR1 "$pid" 2>/dev/null || true
    status=0
    wait "$pid" || status=$?
    assert_equal "run $i: $status $(cat "$exits/rank0")" "run $i: 42 42 node7"
  done
}

@test "the wall-time signal (--signal USR2, HUP) is forwarded too" {
  local ready="$BATS_TEST_TMPDIR/ready" sig watchdog
  for sig in USR2 HUP; do
    rm -f "$ready"
    # The worker starts with every signal at its default: a test run under
    # nohup has HUP ignored, which no shell can trap (nor the worker forward).
    # shellcheck disable=SC2016 # the program's own text
    HPC_SIGNAL=$sig RANK=0 env --default-signal bash "$worker" bash -c 'trap "echo got $2; exit 42" "$2"; : >"$1"; while :; do sleep 0.05; done' _ "$ready" "$sig" \
      >"$BATS_TEST_TMPDIR/out" 2>&1 &
    local pid=$! status=0
    until [[ -e "$ready" ]]; do sleep 0.05; done
    # A signal the program never gets fails the test (137) instead of hanging it.
    (sleep 20 && kill -KILL "$pid") >/dev/null 2>&1 3>&- &
    watchdog=$!
    kill -s "$sig" "$pid"
    wait "$pid" || status=$?
    kill "$watchdog" 2>/dev/null || true
    assert_equal "$status" 42
    assert_equal "$(cat "$BATS_TEST_TMPDIR/out")" "got $sig"
  done
}

@test "20 signals at random instants, the worker short of CPU: each one reaches the program (bash 4.2's read -t loses traps)" {
  local ack="$BATS_TEST_TMPDIR/ack" pid i waited
  # Busy loops take the CPU from the worker (nice 5), so that signals come
  # while it is runnable, not asleep: bash 4.2 then loses the trap of a
  # signal that comes during 'read -t' (or aborts: a double free). teardown
  # kills them, whatever the test's end.
  for _ in 1 2; do
    sh -c 'while :; do :; done' 3>&- &
    busy_loops+=("$!")
  done
  # shellcheck disable=SC2016 # the program's own text
  RANK=0 nice -n 5 bash "$worker" bash -c 'trap ": >\"\$1\"" USR1; : >"$1"; while :; do sleep 0.05; done' _ "$ack" 3>&- &
  pid=$!
  started+=("$pid")
  until [[ -e "$ack" ]]; do sleep 0.05; done
  for ((i = 1; i <= 20; i++)); do
    rm -f "$ack"
    sleep "0.0$((RANDOM % 10))"
    kill -s USR1 "$pid"
    waited=0
    until [[ -e "$ack" ]]; do
      sleep 0.05
      ((++waited < 200)) || fail "signal $i of 20 did not reach the program within 10 s"
    done
  done
  kill -TERM "$pid"
  wait "$pid" || true
}

@test "the program gets INT and QUIT as they came (bash 4.3+; bash 4.2 ignores them in a background command)" {
  local came
  # shellcheck disable=SC2016 # the program's own text
  came=$(bash -c 'sed -n "s/^SigIgn:[[:space:]]*//p" /proc/self/status')
  RANK=0 run bash "$worker" bash -c 'sed -n "s/^SigIgn:[[:space:]]*//p" /proc/self/status'
  assert_success
  if [[ "$(bash -c 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"')" == 4.2 ]]; then
    assert_equal "$((16#$output))" "$((16#$came | 6))"
  else
    assert_equal "$output" "$came"
  fi
}

@test "a signal ignored when the worker starts (USR1, by a torchrun too old to forward it) stays ignored in the program, as it was without the worker" {
  # shellcheck disable=SC2016 # the program's own text
  (trap '' USR1 && RANK=0 exec bash "$worker" bash -c 'sed -n "s/^SigIgn:[[:space:]]*//p" /proc/self/status') >"$BATS_TEST_TMPDIR/out"
  assert_equal "$(( (16#$(cat "$BATS_TEST_TMPDIR/out") >> 9) & 1 ))" 1
}

@test "without RANK or without a command: refused, nothing run" {
  unset RANK
  run --separate-stderr bash "$worker" touch "$BATS_TEST_TMPDIR/ran"
  assert_failure
  assert_regex "$stderr" "RANK: torchrun sets RANK"
  assert_file_not_exists "$BATS_TEST_TMPDIR/ran"
  RANK=0 run --separate-stderr bash "$worker"
  assert_failure 2
  assert_equal "$stderr" "hpc: error: torchrun_worker.sh: no command to run"
}

@test "exit_records reads rank records beside task records, oldest first; first_failure picks the oldest non-zero one, of a kind" {
  in_lib 'record_exit 143 rank0; record_exit 3 rank1; SLURM_PROCID=0 record_exit 3; record_exit 0 rank2
    touch -d "2026-01-01 10:00:02" "$HPC_SUBMISSION_DIR/runs/55/exit/rank0"
    touch -d "2026-01-01 10:00:01" "$HPC_SUBMISSION_DIR/runs/55/exit/rank1"
    touch -d "2026-01-01 10:00:03" "$HPC_SUBMISSION_DIR/runs/55/exit/task0"
    touch -d "2026-01-01 10:00:00" "$HPC_SUBMISSION_DIR/runs/55/exit/rank2"
    exit_records; echo ---; first_failure; first_failure rank; first_failure task; first_failure none || echo none'
  assert_success
  assert_output "0 node7 rank2
3 node7 rank1
143 node7 rank0
3 node7 task0
---
3 node7 rank1
3 node7 rank1
3 node7 task0
none"
}

# launch_torchrun LINE [EXIT]: launch.sh for a 1-node x 2-process torchrun
# trial LINE, with a fake torchrun that starts each worker (RANK 0, then 1)
# as torchrun does and exits 1 when one failed; EXIT makes it exit with that
# code at once, running no worker (a rendezvous that failed).
launch_torchrun() {
  local venv="$BATS_TEST_TMPDIR/venv" fake_torch="$BATS_TEST_TMPDIR/fake torch"
  mkdir -p "$venv/bin" "$fake_torch/torch/distributed" "$BATS_TEST_TMPDIR/src"
  cp "$REPO_ROOT/virtual_env_hpc_files/runtime_venv.sh" "$sub/node/"
  : >"$fake_torch/torch/__init__.py"
  printf 'parser.add_argument("--signals-to-handle")\n' >"$fake_torch/torch/distributed/run.py"
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >"$venv/bin/python"
  cat >"$venv/bin/torchrun" <<'STUB'
#!/usr/bin/env bash
[[ -z "${FAKE_TORCHRUN_EXIT:-}" ]] || exit "$FAKE_TORCHRUN_EXIT"
while (($# > 0)) && [[ "$1" != --no-python ]]; do shift; done
(($# > 0)) || { echo "fake torchrun: no --no-python COMMAND" >&2; exit 2; }
shift
printf 'worker argv:%s\n' "$*"
failed=0
for rank in 0 1; do RANK=$rank LOCAL_RANK=$rank "$@" || failed=1; done
exit "$failed"
STUB
  chmod +x "$venv/bin/python" "$venv/bin/torchrun"
  printf '%s\n' "$1" >"$sub/commands.txt"
  FAKE_TORCHRUN_EXIT=${2:-} HPC_VENV="$venv" HPC_RUNTIME=venv PYTHONPATH="$fake_torch" \
    source_dir="$BATS_TEST_TMPDIR/src" HPC_NODES=1 HPC_PROCS_PER_NODE=2 HPC_SIGNAL_LEAD=90 \
    HPC_KIND=torchrun SLURM_PROCID=0 run --separate-stderr bash "$sub/node/launch.sh"
}

@test "launch.sh under torchrun: the code of the worker that failed first, not torchrun's 1; recorded for batch.sh too" {
  launch_torchrun "python -c 'import os, sys; sys.exit({\"0\": 0, \"1\": 3}[os.environ[\"RANK\"]])'"
  assert_failure 3
  assert_line "worker argv:bash $sub/node/torchrun_worker.sh python -u -c import os, sys; sys.exit({\"0\": 0, \"1\": 3}[os.environ[\"RANK\"]])"
  assert_equal "$(cat "$exits/rank1")" "3 node7"
  assert_equal "$(cat "$exits/task0")" "3 node7"
}

@test "launch.sh under torchrun: success stays 0; a failed rendezvous (no worker ran) keeps torchrun's own code" {
  launch_torchrun 'python -c pass'
  assert_success
  assert_equal "$(cat "$exits/rank0") $(cat "$exits/rank1") $(cat "$exits/task0")" "0 node7 0 node7 0 node7"
  rm -rf -- "${exits:?}"
  launch_torchrun 'python -c pass' 4
  assert_failure 4
  assert_equal "$(cat "$exits/task0")" "4 node7"
}

@test "launch.sh under torchrun: the line's own interpreter (python3, -u once); --pass-local-rank chains the shim inside the worker" {
  launch_torchrun "/usr/bin/env python3 -u -c 'import sys; print(sys.argv[1:])' a"
  assert_success
  assert_line "worker argv:bash $sub/node/torchrun_worker.sh /usr/bin/env python3 -u -c import sys; print(sys.argv[1:]) a"
  export HPC_PASS_LOCAL_RANK=underscore
  launch_torchrun "bash -c 'echo \"\$*\"; exit \$((RANK * 5))' _ x"
  ((status == 5)) || fail "launch.sh exited $status, not 5; stderr: $stderr; records: $(grep -r . "$exits")"
  assert_line "worker argv:bash $sub/node/torchrun_worker.sh bash $sub/node/local_rank_shim.sh --no-python bash -c echo \"\$*\"; exit \$((RANK * 5)) _ x"
  assert_line "x --local_rank=0"
  assert_line "x --local_rank=1"
  assert_equal "$(cat "$exits/rank1")" "5 node7"
}
