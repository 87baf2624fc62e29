#!/usr/bin/env bats
# On the local cluster: a submission folder written with --no-submit is run by
# hand, later, from elsewhere, and again, and runs the code as submitted;
# SBATCH_* variables of the submitting shell cannot change the requeue
# contract; --stage-out keeps one copy per array task and per node.

load '../test_helper'

PROGRAMS="$REPO_ROOT/tests/bats/fixtures/programs"

setup() {
  cluster_test_setup
}

teardown() {
  cancel_test_jobs
}

# sbatch_line_job LINE: runs the printed 'sbatch ...' line; sets job_id.
sbatch_line_job() {
  local out
  out=$(eval "$1" 2>&1) || fail "'$1' failed: $out"
  job_id=${out##* }
  [[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id from '$1': $out"
}

@test "--no-submit, an edit, then the printed sbatch line from another directory, twice: both jobs run the snapshot" {
  local later="$BATS_TEST_TMPDIR/later project" line first second log_dir
  mkdir -p "$later"
  cp -r "$REPO_ROOT/hpc_files" "$REPO_ROOT/virtual_env_hpc_files" "$REPO_ROOT/singularity_hpc_files" "$later/"
  # shellcheck disable=SC2016 # $PWD is the job's
  printf 'echo "code version 1 in $PWD"\n' >"$later/prog.sh"
  git -C "$later" init -q
  git -C "$later" add -A
  git -C "$later" -c user.name=t -c user.email=t@t commit -q -m one
  run --separate-stderr "$later/hpc_files/job_submitter.sh" --site local -p notmpdir -g 0 -W none -t 5 -e later \
    --no-submit -- bash prog.sh </dev/null
  assert_success
  line=${lines[-1]}
  [[ "$line" == "sbatch '"*"/job.sbatch'" ]] || fail "the last line is not an sbatch line: $line"
  # Edited after the folder was written: the job must not see this.
  printf 'echo "code version 2"\n' >"$later/prog.sh"
  cd /
  sbatch_line_job "$line"
  first=$job_id
  wait_job_done "$first" 60
  assert_job_state "$first" COMPLETED
  log_dir="$SCRATCH/later project/hpc_outputs"
  assert_file_contains "$log_dir/later project_later_$first.out" '^code version 1 in .*/later/[0-9-]*-[A-Za-z0-9]*/code$'
  # Again, from a shell that exports nothing and forbids requeues: it still
  # runs (the script names its folder), and the log says what will not work.
  cd "$BATS_TEST_TMPDIR"
  SBATCH_EXPORT=NONE SBATCH_NO_REQUEUE=1 sbatch_line_job "$line"
  second=$job_id
  [[ "$second" != "$first" ]] || fail "the second sbatch gave the same job id"
  wait_job_done "$second" 60
  assert_job_state "$second" COMPLETED
  assert_file_contains "$log_dir/later project_later_$second.out" '^code version 1 in '
  assert_file_contains "$log_dir/later project_later_$second.out" 'this job may not be requeued'
}

@test "SBATCH_NO_REQUEUE, SBATCH_SIGNAL and SBATCH_OPEN_MODE in the submitting shell change nothing: USR1 comes, the job requeues once, one log" {
  SBATCH_NO_REQUEUE=1 SBATCH_SIGNAL=B:USR2@5 SBATCH_OPEN_MODE=truncate \
    submit -p notmpdir -n 1 -g 1 -W none -t 00:01:30 --signal-lead 30 -e contract -- "$PROGRAMS/requeue_probe.sh"
  assert_equal "$(job_field "$job_id" Requeue)" 1
  release_requeued "$job_id" 1 150
  wait_job_done "$job_id" 90
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial 'requeue_probe: got SIGUSR1; checkpointing'
  assert_output --partial 'requeue_probe: resumed after 1 requeue(s)'
  assert_equal "$(grep -c '^hpc: job .* started' <<<"$output")" 2
  refute_output --partial 'SBATCH_'
}

@test "--stage-out with a 2-task array on 2 nodes: one copy per task and per node" {
  local configs="$BATS_TEST_TMPDIR/two.txt" task node
  # shellcheck disable=SC2016 # expanded on the node
  printf '%s\n' 'bash -c "mkdir -p \$SLURM_TMPDIR/results && echo trial \$HPC_TRIAL_INDEX rank \$SLURM_PROCID on \$SLURMD_NODENAME >\$SLURM_TMPDIR/results/out.txt"' >"$configs"
  cat "$configs" "$configs" >"$configs.2" && mv "$configs.2" "$configs"
  submit -p notmpdir -n 2 -g 1 -W lightning -t 5 -e stage2 --stage-out results -C "$configs"
  for task in 0 1; do
    wait_job_done "${job_id}_$task" 90
    assert_job_state "${job_id}_$task" COMPLETED
    for node in node1 node2; do
      assert_file_contains "$SCRATCH/$project/stage2/trials/$task/results/$node/out.txt" "^trial $task rank [01] on $node$"
    done
  done
  assert_file_not_exists "$SCRATCH/$project/stage2/results"
}
