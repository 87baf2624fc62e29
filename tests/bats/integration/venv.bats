#!/usr/bin/env bats
# --setup-venv: a blocking setup job builds the venv from a requirements file
# when the file changed, the training job waits for it (afterok) and runs in
# it; an unchanged file submits no setup job; a failed setup cancels the run.

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  venv="$BATS_TEST_TMPDIR/venv"
  requirements="$BATS_TEST_TMPDIR/requirements.txt"
}


@test "--setup-venv builds the venv in a job first, only when the requirements changed, and the run uses it" {
  echo "# nothing to install: the setup job only creates the venv" >"$requirements"
  submit -n 1 -g 0 -W none -t 5 -e venv --venv "$venv" --setup-venv "$requirements" -- \
    python -c 'import sys; print("venv-python", sys.prefix)'
  assert_file_contains "$submit_err" "venv: setup job [0-9][0-9]* builds $venv"
  local setup_id
  setup_id=$(sed -n 's/.*venv: setup job \([0-9]*\) builds.*/\1/p' "$submit_err")
  run job_field "$job_id" Dependency
  assert_output --partial "afterok:$setup_id"
  wait_job_done "$setup_id" 240
  assert_job_state "$setup_id" COMPLETED
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  assert_file_exists "$venv/.hpc-requirements.sha256"
  run cat "$SCRATCH/$project/hpc_outputs/${project}_venv_$job_id.out"
  assert_output --partial "venv-python $venv"

  # Same requirements: no second setup job. The job is held in the queue while
  # another submission's --setup-venv installs other requirements into the same
  # venv: once released, it runs with them and says so.
  submit -n 1 -g 0 -W none -t 5 -e venv --venv "$venv" --setup-venv "$requirements" --sbatch-arg=--hold -- true
  assert_file_contains "$submit_err" "venv: $venv matches requirements.txt; no setup job"
  local held=$job_id before after
  before=$(cat "$venv/.hpc-requirements.sha256")
  echo "# other requirements" >>"$requirements"
  submit -n 1 -g 0 -W none -t 5 -e venv2 --venv "$venv" --setup-venv "$requirements" -- true
  setup_id=$(sed -n 's/.*venv: setup job \([0-9]*\) builds.*/\1/p' "$submit_err")
  wait_job_done "$setup_id" 240
  after=$(cat "$venv/.hpc-requirements.sha256")
  scontrol release "$held"
  wait_job_done "$held" 60
  assert_job_state "$held" COMPLETED
  run cat "$SCRATCH/$project/hpc_outputs/${project}_venv_$held.out"
  assert_output --partial "hpc: warning: $venv now holds other requirements than at submission (digest ${after:0:12}, was ${before:0:12}: a later --setup-venv changed it)"
  wait_job_done "$job_id" 60
}

@test "a failed venv setup cancels the training job instead of leaving it pending" {
  echo "/nonexistent/package/for/the/test" >"$requirements"
  submit -n 1 -g 0 -W none -t 5 -e venvfail --venv "$venv" --setup-venv "$requirements" -- echo SHOULD-NOT-RUN
  local setup_id
  setup_id=$(sed -n 's/.*venv: setup job \([0-9]*\) builds.*/\1/p' "$submit_err")
  wait_job_done "$setup_id" 240
  assert_job_state "$setup_id" FAILED
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" CANCELLED
  refute [ -e "$venv/.hpc-requirements.sha256" ]
}
