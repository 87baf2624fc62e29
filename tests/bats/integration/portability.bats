#!/usr/bin/env bats
# The job runs its node scripts under the bash first on the submitting PATH
# (the batch script execs `bash` from PATH): with bash 4.2 first on PATH
# (make test-portability sets HPC_TEST_EXPECT_BASH=4.2), node/batch.sh,
# node/launch.sh and `bash` in the program all are 4.2. The job's srun is the
# submitting PATH's too (the 24.11 one on the 24.11 cluster).

load '../test_helper'

setup() {
  cluster_test_setup
}

teardown() {
  cancel_test_jobs
}

@test "batch.sh, launch.sh and the job's bash are the bash first on the submitting PATH" {
  local want
  want=$(readlink -f "$(command -v bash)")
  submit -n 1 -g 0 -c 1 -W none -t 5 -e bashver -- "$REPO_ROOT/tests/bats/fixtures/programs/bash_probe.sh"
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_line "bash_probe path=$want"
  assert_line --regexp "^bash_probe launch=$want cmd=.*/node/launch.sh"
  assert_line "bash_probe batch=$want"
  # A 22.05 srun in a 24.11 job fails ("Invalid Protocol Version").
  assert_line "bash_probe srun=$(readlink -f "$(command -v srun)")"
  if [[ -n "${HPC_TEST_EXPECT_BASH:-}" ]]; then
    assert_line "bash_probe version=$HPC_TEST_EXPECT_BASH"
  fi
}
