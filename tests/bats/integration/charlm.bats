#!/usr/bin/env bats
# The second example (python -m hpc_harness.examples.charlm: hpc_harness.pieces in a
# plain loop) through job_submitter.sh on the real local cluster: 2 nodes x 2
# processes, a wall-time requeue mid-run, and final weights bitwise equal to an
# uninterrupted run's.

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
}

@test "charlm on 2 nodes x 2 processes: a wall-time signal requeues it and it ends bitwise equal to an uninterrupted run" {
  local args=(--steps 120 --seed 11 --log-every 5 --checkpoint-every-s 0 --step-sleep 0.05)
  submit -n 2 -g 2 -c 1 -W torchrun -t 10 -e lm_straight -- python -m hpc_harness.examples.charlm "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/straight"
  local straight=$job_id
  submit -n 2 -g 2 -c 1 -W torchrun -t 10 -e lm_interrupted -- python -m hpc_harness.examples.charlm "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/interrupted"
  local interrupted=$job_id
  # Mid-epoch, deliver the wall-time signal as SLURM does: USR1 to the batch shell.
  wait_log "$interrupted" '^hpc_harness: step (1[5-9]|[2-9][0-9])/' 180
  scancel --signal=USR1 --batch "$interrupted"
  release_requeued "$interrupted" 1
  wait_job_done "$straight" 240
  wait_job_done "$interrupted" 240
  assert_job_state "$straight" COMPLETED
  assert_job_state "$interrupted" COMPLETED
  run job_log "$interrupted"
  assert_output --partial 'hpc_harness: world_size=4 rank=0'
  assert_equal "$(grep -c 'host node1 started' <<<"$output")" 4
  assert_equal "$(grep -c 'host node2 started' <<<"$output")" 4
  assert_output --partial 'received: checkpointed at global step'
  assert_output --regexp "requeued $interrupted \(restart 1 of at most 10\)"
  assert_output --regexp 'resumed from .*ckpt_step'
  assert_output --partial 'finished at global step 120'
  assert_weights_equal "$BATS_TEST_TMPDIR/straight/last.pt" "$BATS_TEST_TMPDIR/interrupted/last.pt"
}
