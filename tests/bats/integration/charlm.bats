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
  local straight interrupted
  straight_and_interrupted -n 2 -g 2 -c 1 -W torchrun -t 10 -- python -m hpc_harness.examples.charlm \
    --steps 120 --seed 11 --log-every 5 --checkpoint-every-s 0 --step-sleep 0.05
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
