#!/usr/bin/env bats
# Hyperparameter search as one array job on the real local cluster: a grid
# from a sweep file, seeded random search, --seeds, per-trial folders, and a
# failing trial that fails its own array task only.

load '../test_helper'

SWEEPS="$REPO_ROOT/tests/bats/fixtures/sweeps"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
}

@test "a 2x3 grid from a sweep file runs as one 6-task array (throttle 2): every trial once, right arguments, own folder" {
  submit -n 1 -g 1 -W none -t 5 -e grid --sweep "$SWEEPS/grid_probe.yml" --array-throttle 2
  run job_field "$job_id" ArrayTaskThrottle
  assert_output 2
  wait_array_done "$job_id" 6 180
  run array_states "$job_id"
  assert_output "$(printf '%s COMPLETED\n' 0 1 2 3 4 5)"
  # wandb's grid order: parameters sorted by name, the last one varying fastest.
  local expected=(
    "--layers=1 --lr=0.01" "--layers=1 --lr=0.05" "--layers=2 --lr=0.01"
    "--layers=2 --lr=0.05" "--layers=3 --lr=0.01" "--layers=3 --lr=0.05"
  )
  local k
  for k in 0 1 2 3 4 5; do
    assert_file_contains "$SCRATCH/$project/hpc_outputs/${project}_grid_${job_id}_$k.out" "^trial=$k args=${expected[$k]}\$"
    # Each trial wrote exactly its own line in its own folder: ran exactly once.
    run cat "$SCRATCH/$project/grid/trials/$k/result.txt"
    assert_output "${expected[$k]}"
  done
}

@test "--seeds 3 triples the trials, each with its seed; a failing trial fails only its own task" {
  local configs="$BATS_TEST_TMPDIR/configs.txt"
  printf '%s\n' "bash tests/bats/fixtures/programs/print_args.sh --fail=0" \
    "bash tests/bats/fixtures/programs/print_args.sh --fail=1" >"$configs"
  run "$SUBMITTER" --site local -C "$configs" --seeds 3 --list-trials
  assert_success
  assert_equal "${#lines[@]}" 6
  submit -n 1 -g 1 -W none -t 5 -e seeds -C "$configs" --seeds 3 --array-throttle 3
  wait_array_done "$job_id" 6 180
  run array_states "$job_id"
  assert_output "$(printf '0 COMPLETED\n1 COMPLETED\n2 COMPLETED\n3 FAILED\n4 FAILED\n5 FAILED')"
  assert_file_contains "$SCRATCH/$project/hpc_outputs/${project}_seeds_${job_id}_4.out" '^trial=4 args=--fail=1 --seed=1$'
  run scontrol show job -o "${job_id}_4"
  assert_output --partial 'ExitCode=5:0'
}

@test "a seeded random search lists the same trials twice, and other trials for another seed" {
  local first second other
  first=$("$SUBMITTER" --site local --sweep "$SWEEPS/random_probe.yml" --trials 5 --sweep-seed 11 --list-trials)
  second=$("$SUBMITTER" --site local --sweep "$SWEEPS/random_probe.yml" --trials 5 --sweep-seed 11 --list-trials)
  other=$("$SUBMITTER" --site local --sweep "$SWEEPS/random_probe.yml" --trials 5 --sweep-seed 12 --list-trials)
  assert_equal "$(wc -l <<<"$first")" 5
  assert_equal "$first" "$second"
  [[ "$first" != "$other" ]] || fail "seeds 11 and 12 drew the same trials"
  # Nothing was written by --list-trials.
  run find "$SCRATCH" -mindepth 1
  assert_output ''
}
