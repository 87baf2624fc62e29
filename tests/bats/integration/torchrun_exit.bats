#!/usr/bin/env bats
# -W torchrun jobs on the real local cluster end with their program's own exit
# code: torchrun exits 1 whatever its workers' codes, so each worker runs under
# node/torchrun_worker.sh, which records its code; the job takes the code of
# the worker that failed first (128+N for one killed by signal N), and the log
# names its rank. Success and the requeue (marker, exit 42) are unchanged.

load '../test_helper'

PROGRAMS="$REPO_ROOT/tests/bats/fixtures/programs"

# worker.py FAIL HOW, the program: prints its rank and node, and the binary
# that runs torchrun_worker.sh (its parent); rank FAIL then
# exits 3 (HOW 'exit') or kills itself with SIGKILL ('kill'), while the
# others wait until torchrun or srun stops them. FAIL -1: every rank exits 0.
WORKER='import os, signal, sys, time
rank, fail, how = int(os.environ["RANK"]), int(sys.argv[1]), sys.argv[2]
node, parent = os.environ["SLURMD_NODENAME"], os.readlink(f"/proc/{os.getppid()}/exe")
os.write(1, f"worker rank {rank} on {node}\nworker parent {parent}\n".encode())  # one write: lines stay whole
if rank == fail:
    sys.exit(3) if how == "exit" else os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120 if fail >= 0 else 0)'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  worker="$BATS_TEST_TMPDIR/worker.py"
  printf '%s\n' "$WORKER" >"$worker"
}

# worker_node RANK: the node the program's rank RANK ran on, from the log in $output.
worker_node() {
  sed -n "s/^worker rank $1 on \(node[12]\)\$/\1/p" <<<"$output"
}

# assert_failed_with JOB CODE RANK: the job ended FAILED with exit code CODE
# (sacct's CODE:0), and its log names RANK, on the node it ran on, as the
# one that failed first.
assert_failed_with() {
  local job=$1 code=$2 rank=$3 node
  wait_job_done "$job" 120
  assert_job_state "$job" FAILED
  assert_equal "$(job_field "$job" ExitCode)" "$code:0"
  run job_log "$job"
  node=$(worker_node "$rank")
  [[ -n "$node" ]] || fail "no 'worker rank $rank' line in the log: $output"
  assert_line "hpc: error: rank$rank on $node exited first, with code $code"
  assert_line --regexp "^hpc: training step ended with exit code $code at "
}

@test "torchrun 1 node x 2 processes: rank 1 exits 3; the job ends FAILED 3:0 and the log names rank 1" {
  submit -n 1 -g 2 -c 1 -W torchrun -t 5 --signal-lead 60 -e exit1x2 -- python "$worker" 1 exit
  assert_failed_with "$job_id" 3 1
}

@test "torchrun 2 nodes x 2 processes: rank 2 exits 3; the job ends FAILED 3:0 and the log names rank 2 on its node" {
  submit -n 2 -g 2 -c 1 -W torchrun -t 5 --signal-lead 60 -e exit2x2 -- python "$worker" 2 exit
  assert_failed_with "$job_id" 3 2
}

@test "torchrun 2 nodes x 1 process: rank 1 killed by SIGKILL; the job ends FAILED 137:0 (128+9) and the log names rank 1" {
  submit -n 2 -g 1 -c 1 -W torchrun -t 5 --signal-lead 60 -e kill2x1 -- python "$worker" 1 kill
  assert_failed_with "$job_id" 137 1
}

@test "torchrun 1x2 and 2x1, every rank exits 0: COMPLETED 0:0, as before" {
  local jobs=() job parents
  submit -n 1 -g 2 -c 1 -W torchrun -t 5 --signal-lead 60 -e ok1x2 -- python "$worker" -1 exit
  jobs+=("$job_id")
  submit -n 2 -g 1 -c 1 -W torchrun -t 5 --signal-lead 60 -e ok2x1 -- python "$worker" -1 exit
  jobs+=("$job_id")
  for job in "${jobs[@]}"; do
    wait_job_done "$job" 120
    assert_job_state "$job" COMPLETED
    assert_equal "$(job_field "$job" ExitCode)" 0:0
    run job_log "$job"
    assert_equal "$(grep -c '^worker rank [01] on node[12]$' <<<"$output")" 2
    assert_line --regexp "^hpc: training step ended with exit code 0 at "
    refute_output --partial 'exited first'
    # Under tools/with_bash42.sh the workers' wrapper ran under bash 4.2 too.
    [[ -n "${HPC_TEST_EXPECT_BASH:-}" ]] || continue
    parents=$(sed -n 's/^worker parent //p' <<<"$output" | sort -u)
    [[ -n "$parents" && "$parents" != *$'\n'* ]] || fail "not one parent binary: '$parents'"
    # shellcheck disable=SC2016 # expanded by the bash under test
    assert_equal "$("$parents" -c 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"')" "$HPC_TEST_EXPECT_BASH"
  done
}

@test "torchrun 2 nodes x 1 process: the wall-time signal reaches every worker through torchrun_worker.sh; marker and 42 requeue the job, which then completes" {
  submit -p notmpdir -n 2 -g 1 -c 1 -W torchrun -t 5 --signal-lead 60 -e rq2x1 -- "$PROGRAMS/requeue_probe.sh"
  wait_log "$job_id" '^requeue_probe: run restart=0' 120 2 # both workers started
  # As SLURM does at the wall time: USR1 to the batch shell.
  scancel --signal=USR1 --batch "$job_id"
  release_requeued "$job_id" 1
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_equal "$(grep -c '^requeue_probe: got SIGUSR1; checkpointing$' <<<"$output")" 2
  # Each task ended with the workers' 42, not torchrun's 1 (nor a status lost to the signal).
  assert_output --regexp 'srun: error: node[12]: task [01]: Exited with exit code 42'
  refute_output --regexp 'task [01]: Exited with exit code [^4]'
  assert_output --regexp "requeued $job_id \(restart 1 of at most 10\)"
  assert_equal "$(grep -c '^requeue_probe: resumed after 1 requeue(s)$' <<<"$output")" 2
  refute_output --partial 'exited first'
}
