#!/usr/bin/env bats
# The example training job (python -m hpc_harness.train) through
# job_submitter.sh on the real local cluster: 2 nodes x 2 processes in both
# launch modes, and a wall-time requeue that resumes from the checkpoint and
# ends with the same weights as an uninterrupted run.

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  # One dataset for every test in this file, written once.
  data=$(digits_dataset)
}



@test "the example trains on 2 nodes x 2 processes with srun (lightning layout) and with torchrun; all agree on world size 4" {
  local kind launcher jobs=()
  for kind in lightning torchrun; do
    submit -n 2 -g 2 -c 1 -W "$kind" -t 10 -e "ex_$kind" -- \
      python -m hpc_harness.train --epochs 6 --data-dir "$data" --ckpt-dir "$BATS_TEST_TMPDIR/ck_$kind"
    jobs+=("$job_id")
  done
  for job_id in "${jobs[@]}"; do
    wait_job_done "$job_id" 240
    assert_job_state "$job_id" COMPLETED
  done
  for i in 0 1; do
    kind=$([[ $i == 0 ]] && echo lightning || echo torchrun)
    launcher=$([[ $i == 0 ]] && echo srun || echo torchrun)
    run job_log "${jobs[$i]}"
    assert_output --partial "hpc_harness: world_size=4 rank=0"
    assert_output --partial "launcher=$launcher"
    assert_equal "$(grep -cE '^hpc_harness: rank [0-3]/4 local_rank [01] host node[12] started$' <<<"$output")" 4
    assert_equal "$(grep -c 'host node1 started' <<<"$output")" 2
    assert_equal "$(grep -c 'host node2 started' <<<"$output")" 2
    assert_output --regexp "final test accuracy 0\\.(8[5-9]|9[0-9])"
    assert_file_exists "$BATS_TEST_TMPDIR/ck_$kind/last.pt"
  done
}



@test "2 nodes x 4 tasks: a wall-time signal checkpoints, requeues and resumes; final weights equal an uninterrupted run's, bitwise" {
  # World size 8 across two nodes: the fixed-order gradient reduction keeps
  # the interrupted run bitwise equal (an epoch's partial last batch included).
  local straight interrupted
  straight_and_interrupted -n 2 -g 4 -c 1 -W torchrun -t 10 -- python -m hpc_harness.train \
    --epochs 2 --batch-size 8 --seed 7 --checkpoint-every 10 --signal-check-every 1 --step-sleep 0.05 --data-dir "$data"
  run job_log "$interrupted"
  assert_output --partial 'hpc_harness: world_size=8 rank=0'
  assert_output --partial 'received SIGUSR1'
  assert_output --regexp "requeued $interrupted \(restart 1 of at most 10\)"
  assert_output --regexp 'resum(ed|ing) from .*ckpt_step'
  assert_weights_equal "$BATS_TEST_TMPDIR/straight/last.pt" "$BATS_TEST_TMPDIR/interrupted/last.pt"
}

@test "same -e, another --lr: the job refuses to resume (exit 2, keys named; warned at submission); --fresh starts over and keeps the old files aside" {
  local args=(--epochs 1 --seed 3 --data-dir "$data") ckpts="$SCRATCH/$project/same/checkpoints"
  submit -n 1 -g 1 -W none -t 10 -e same -- python -m hpc_harness.train "${args[@]}" --lr 0.1
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" COMPLETED
  assert_file_exists "$ckpts/run.json"
  # Another learning rate, same experiment: warned here, refused on the node.
  submit -n 1 -g 1 -W none -t 10 -e same -- python -m hpc_harness.train "${args[@]}" --lr 0.001
  assert_file_contains "$submit_err" "warning: experiment 'same' already holds checkpoints"
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" FAILED
  assert_equal "$(job_field "$job_id" ExitCode)" 2:0
  run job_log "$job_id"
  assert_output --regexp "holds checkpoints of another run: (.*, )?lr \\(0\\.1 -> 0\\.001\\)(, .*)? differ; use another experiment \\(-e NEW"
  refute_output --regexp '^hpc_harness: step [0-9]+/'
  # --fresh: starts at step 0; the first run's files are kept aside.
  submit -n 1 -g 1 -W none -t 10 -e same -- python -m hpc_harness.train "${args[@]}" --lr 0.001 --fresh
  assert_equal "$(cat "$submit_err")" ""
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial 'starting fresh'
  refute_output --regexp 'resum(ed|ing) from'
  run find "$SCRATCH/$project/same" -maxdepth 2 -path '*/checkpoints.old-*/run.json'
  assert_equal "${#lines[@]}" 1
}

# gpu_choice OPTIONS...: what gpu_choice_probe.py prints in each task of a
# one-node srun with these GPU options, sorted by task.
gpu_choice() {
  PYTHONPATH="$REPO_ROOT" timeout 120 srun -N1 -p tmpdir "$@" \
    "$REPO_ROOT/.venv/bin/python" "$REPO_ROOT/tests/bats/fixtures/programs/gpu_choice_probe.py" 2>&1 | sort
}

@test "each srun task gets a GPU of its own, bound by SLURM or not, tasks bound to the same GPUs take one each, and two tasks on one GPU are refused (fake GPUs, torch told what SLURM set)" {
  run gpu_choice --gres=gpu:2 --ntasks-per-node=2
  assert_output $'task 0 gpu 0\ntask 1 gpu 1'
  run gpu_choice --gpus-per-task=1 --ntasks-per-node=2
  assert_output $'task 0 gpu 0\ntask 1 gpu 1'
  run gpu_choice --gres=gpu:2 --ntasks-per-node=2 --gpu-bind=single:1
  assert_output $'task 0 gpu 0\ntask 1 gpu 1'
  run gpu_choice --gpus-per-task=2 --ntasks-per-node=2
  assert_output $'task 0 gpu 0\ntask 1 gpu 2'
  run gpu_choice --gres=gpu:1 --ntasks-per-node=2
  assert_line 'task 0 gpu 0'
  assert_line 'task 1 refused: local rank 1 has no GPU: 1 selected ([0]) for the 2 processes of this node; start one process per GPU'
  # Tasks bound to the same GPUs, as --gpu-bind=closest binds the tasks of one socket (one
  # socket here: the masks make it); they meet in the rendezvous store to take one each.
  run gpu_choice --gres=gpu:4 --ntasks-per-node=4 --gpu-bind=mask_gpu:0x3,0xc,0x3,0xc
  assert_output $'task 0 gpu 0\ntask 1 gpu 2\ntask 2 gpu 1\ntask 3 gpu 3'
  run gpu_choice --gres=gpu:2 --ntasks-per-node=4 --gpu-bind=map_gpu:0,1,0,1
  assert_line 'task 2 refused: local rank 2 has no GPU: 1 selected ([0]) for local ranks [0, 2], bound to them; start one process per GPU'
}
