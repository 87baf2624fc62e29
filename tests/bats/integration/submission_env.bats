#!/usr/bin/env bats
# On the local cluster: what the submitter passes to sbatch as sbatch reads
# it (short options, a repeat of its own options: the seed's SlurmCluster),
# short debug jobs, and limits refused at submission. (A shell or allocation
# that must not bend the job: reliability/hostile_inputs.bats.)

load '../test_helper'

setup() {
  cluster_test_setup
}

teardown() {
  cancel_test_jobs
}

@test "--sbatch-arg '-w node2': a short option with its value as a separate word is passed as sbatch reads it" {
  submit -p notmpdir -g 0 -W none -t 5 -e shortopt --sbatch-arg '-w node2' -- true
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  assert_equal "$(job_field "$job_id" NodeList)" node2
}

@test "a 2-minute debug job with the default options runs (the default signal lead fits it)" {
  submit -p notmpdir -g 0 -W none -t 00:02:00 -e debug2min -- true
  assert_file_contains "$submit_err" 'the wall-time signal comes 60 s before the end'
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
}

@test "seed 000's SlurmCluster example, its add_slurm_cmd('ntasks-per-node') included, runs its 9-trial grid on 2 nodes x 2 GPUs" {
  local out task
  out=$(cd "$BATS_TEST_TMPDIR" && HPC_SITE=local "$REPO_ROOT/.venv/bin/python" \
    "$REPO_ROOT/tests/bats/fixtures/programs/seed_slurm_cluster.py" 2>&1) || fail "the seed script failed: $out"
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  [[ -n "$job_id" ]] || fail "no job id in: $out"
  for task in 0 1 2 3 4 5 6 7 8; do
    wait_job_done "${job_id}_$task" 300
    assert_job_state "${job_id}_$task" COMPLETED
  done
  run cat "$SCRATCH/$project/hpc_outputs/${project}_seed_grid_${job_id}_8.out"
  assert_output --partial 'seed trial: learning_rate=0.1 layers=64 rank=3 of 4'
}

@test "a request over the nodes' memory fails at submission with both numbers, nothing queued" {
  local largest limit gib
  largest=$(sinfo -h -p notmpdir -o '%m' | sort -n | tail -n 1)
  limit=$(scontrol show partition notmpdir -o | sed -n 's/.* MaxMemPerNode=\([0-9]*\) .*/\1/p')
  # The production shape's MaxMemPerNode is below the nodes' memory: it is named first.
  gib=$((${limit:-$largest} / 1024 + 1))
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -g 1 -m "${gib}G" -t 5 -e toomuch -- true </dev/null
  assert_equal "$status" 2
  if [[ -n "$limit" ]]; then
    assert_equal "$stderr" "job_submitter.sh: error: this job asks for $((gib * 1024)) MiB per node (--mem ${gib}G: -m/--mem-per-gpu x GPUs or processes) but partition 'notmpdir' allows $limit MiB (MaxMemPerNode); lower -m"
  else
    assert_equal "$stderr" "job_submitter.sh: error: this job asks for $((gib * 1024)) MiB per node (--mem ${gib}G: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition 'notmpdir' has $largest MiB; lower -m"
  fi
  assert_not_exist "$SCRATCH/$project/toomuch"
}
