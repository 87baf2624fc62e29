#!/usr/bin/env bats
# The container runtime (-s image.sif) on the real local cluster, through a
# pass-through STAND-IN for singularity (tests/bats/fixtures/standin/):
# Apptainer/Singularity cannot be installed on this machine. What is real:
# the scheduler, the 2-node layout, torchrun's rendezvous, the argv the
# toolkit gives singularity and the environment it passes (and keeps out of
# argv). What is not: the container itself.

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  export PATH="$REPO_ROOT/tests/bats/fixtures/standin:$PATH"
  export STANDIN_ARGV_LOG="$BATS_TEST_TMPDIR/singularity-argv.log"
  export STANDIN_IMAGE_PATH="$REPO_ROOT/.venv/bin:/usr/bin:/bin"
  image="$BATS_TEST_TMPDIR/image.sif"
  echo "not a real image" >"$image"
  # A private HOME with a wandb key the job must read without exposing it.
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  # 40 hex digits made here, so that no project file (nor its snapshot) holds them.
  secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
  (umask 077 && echo "$secret" >"$HOME/wandb_credentials.txt")
}

@test "stand-in singularity: a 2-node torchrun job runs inside the 'container' with the environment passed, not in argv" {
  local out err="$BATS_TEST_TMPDIR/submit.err"
  out=$("$SUBMITTER" --site local -n 2 -g 2 -c 1 -W torchrun -t 5 -e sing -s "$image" -- \
    bash -c 'echo "inside rank=$RANK world=$WORLD_SIZE node=$SLURMD_NODENAME key_len=${#WANDB_API_KEY} exp=$exp_name path=$PATH"' 2>"$err") ||
    fail "submission failed: $(cat "$err")"
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" COMPLETED
  run cat "$SCRATCH/$project/hpc_outputs/"*"_$job_id.out"
  assert_equal "$(grep -cE "^inside rank=[0-3] world=4 node=node[12] key_len=40 exp=sing path=$STANDIN_IMAGE_PATH\$" <<<"$output")" 4
  # One 'singularity exec' per node wraps torchrun (one more per node asks the
  # image's torch whether torchrun forwards signals), with the binds and --nv.
  run cat "$STANDIN_ARGV_LOG"
  assert_equal "$(grep -c '^exec$' <<<"$output")" 4
  assert_equal "$(grep -cxF -A1 "$image" <<<"$output" | head -n 1)" 4
  assert_equal "$(grep -xF -A1 "$image" <<<"$output" | grep -cx torchrun)" 2
  assert_line --index 1 -- --cleanenv
  assert_line --index 2 -- --nv
  assert_output --partial "$(printf -- '--bind\n%s\n' "$REPO_ROOT")"
  assert_output --partial "$(printf -- '--bind\n%s\n' "$SCRATCH/$project")"
  assert_output --partial "$(printf '%s\ntorchrun\n' "$image")"
  # The key reached the program, but never a command line, the script or the log.
  refute_output --partial "$secret"
  run grep -rl "$secret" "$SCRATCH"
  assert_output ''
}

@test "stand-in singularity: the program imports the project's packages from the job's code snapshot" {
  # From / (not the snapshot, the container's working folder): only PYTHONPATH
  # can lead to the snapshot, else the venv's editable install serves the live
  # tree, which may have changed since the submission.
  submit -g 0 -c 1 -W none -t 5 -e sing_code -s "$image" -- \
    bash -c 'cd / && python -c "import hpc_harness; print(\"imported\", hpc_harness.__file__)"'
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  run cat "$SCRATCH/$project/hpc_outputs/"*"_$job_id.out"
  assert_line --regexp "^imported $SCRATCH/$project/sing_code/[^/]+/code/hpc_harness/__init__.py\$"
}
