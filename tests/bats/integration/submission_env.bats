#!/usr/bin/env bats
# On the local cluster: a submitting shell cannot bend the job. A submission
# from inside an allocation (salloc, a job), SBATCH_* variables in the shell,
# a job sbatch-ed from an empty environment, and short sbatch options.

load '../test_helper'

setup() {
  cluster_test_setup
}

teardown() {
  cancel_test_jobs
}

@test "a submission from inside 'salloc --mem-per-cpu' runs: the allocation's SLURM_* do not reach the job's sruns" {
  local out status_file="$BATS_TEST_TMPDIR/status"
  # The inner submission's --wait exits with the job's exit code.
  out=$(salloc -n1 -c1 --mem-per-cpu=100M -p notmpdir bash -c \
    '"$1" --site local -p notmpdir -g 0 -W none -t 5 -e inside --wait -- true; echo "$?" >"$2"' \
    _ "$SUBMITTER" "$status_file" </dev/null 2>&1) || fail "salloc failed: $out"
  assert_equal "$(cat "$status_file")" 0
  [[ "$out" != *"mutually exclusive"* ]] || fail "srun refused the allocation's memory variables: $out"
}

@test "SBATCH_PARTITION, SBATCH_ARRAY_INX, SBATCH_JOB_NAME and SBATCH_GPUS_PER_TASK in the shell change nothing" {
  local configs="$BATS_TEST_TMPDIR/four.txt" task
  printf 'true\n%.0s' 1 2 3 4 >"$configs"
  SBATCH_PARTITION=urgent SBATCH_ARRAY_INX=0-1 SBATCH_JOB_NAME=x SBATCH_GPUS_PER_TASK=1 \
    submit -p notmpdir -g 0 -W none -t 5 -e shellvars -C "$configs"
  assert_equal "$(job_field "$job_id" Partition)" notmpdir
  assert_equal "$(job_field "$job_id" JobName)" "${project}_shellvars"
  [[ "$(scontrol show job -o "$job_id" | head -n 1)" != *gpu* ]] || fail "the job got a GPU: $(scontrol show job "$job_id")"
  for task in 0 1 2 3; do
    wait_job_done "${job_id}_$task" 120
    assert_job_state "${job_id}_$task" COMPLETED
    assert_file_exists "$SCRATCH/$project/hpc_outputs/${project}_shellvars_${job_id}_$task.out"
  done
}

@test "a job.sbatch sbatch-ed from an empty environment (env -i, no HOME, no USER) runs" {
  local line out
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -g 0 -W none -t 5 -e empty --no-submit -- true </dev/null
  assert_success
  line=${lines[-1]}
  out=$(cd / && env -i PATH=/usr/bin:/bin SLURM_CONF="$SLURM_CONF" bash -c "$line" 2>&1) || fail "'$line' failed: $out"
  job_id=${out##* }
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
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
  local largest gib
  largest=$(sinfo -h -p notmpdir -o '%m' | sort -n | tail -n 1)
  gib=$((largest / 1024 + 1))
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -g 1 -m "${gib}G" -t 5 -e toomuch -- true </dev/null
  assert_equal "$status" 2
  assert_equal "$stderr" "job_submitter.sh: error: this job asks for $((gib * 1024)) MiB per node (--mem ${gib}G: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition 'notmpdir' has $largest MiB; lower -m"
  assert_not_exist "$SCRATCH/$project/toomuch"
}
