#!/usr/bin/env bats
# hpc_files/node/wandb_agent.sh with a fake `wandb` on PATH that, like the
# real agent, starts each run with `python` from PATH (so through the
# wrapper's shim) and exits 0 whatever the runs did. The real agent and the
# signal path: tests/python/test_wandb_wrapper.py (slow).

load '../test_helper'

WRAPPER="$REPO_ROOT/hpc_files/node/wandb_agent.sh"

setup() {
  bin="$BATS_TEST_TMPDIR/fake bin"
  mkdir -p "$bin"
  export FAKE_WANDB_LOG="$BATS_TEST_TMPDIR/wandb.log"
  # wandb agent ... : one run per word of $FAKE_RUNS ('ID:STATUS'), each
  # `python -c PROGRAM` with WANDB_RUN_ID set; then exits $FAKE_AGENT_EXIT.
  cat >"$bin/wandb" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$FAKE_WANDB_LOG"
for run in $FAKE_RUNS; do
  WANDB_RUN_ID=${run%%:*} CHILD_EXIT=${run#*:} ${FAKE_LAUNCHER:-python} -c '
import os, sys
open(os.path.join(os.environ["HPC_TRIAL_DIR"], "ran"), "w").close()
sys.exit(int(os.environ["CHILD_EXIT"]))'
done
exit "${FAKE_AGENT_EXIT:-0}"
STUB
  chmod +x "$bin/wandb"
  export PATH="$bin:$PATH"
  export scratch_dir="$BATS_TEST_TMPDIR/scratch space/proj" exp_name=sweep
  export HPC_TRIAL_DIR="$scratch_dir/$exp_name/trials/3"
  mkdir -p "$HPC_TRIAL_DIR"
  unset FAKE_AGENT_EXIT FAKE_LAUNCHER
}

@test "all runs succeed: exit 0; each run's files under runs/<run id>; the task logs its runs" {
  export FAKE_RUNS="r1:0 r2:0"
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 2 ent/proj/sw1
  assert_success
  assert_line "hpc: wandb agent finished 2 run(s), all succeeded"
  assert_file_exists "$scratch_dir/$exp_name/runs/r1/ran"
  assert_file_exists "$scratch_dir/$exp_name/runs/r2/ran"
  assert_equal "$(cat "$HPC_TRIAL_DIR/wandb_runs.txt")" $'r1 0 -\nr2 0 -'
  assert_equal "$(cat "$FAKE_WANDB_LOG")" "agent --forward-signals --count 2 ent/proj/sw1"
}

@test "a failed run makes the task fail with its code, though the agent exits 0" {
  export FAKE_RUNS="r1:0 r2:3"
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 2 ent/proj/sw1
  assert_failure 3
  assert_equal "$stderr" "hpc: error: wandb run r2 exited with code 3 (wandb agent reported success)"
}

@test "a run that checkpointed and asked for a requeue (42): the task exits 42" {
  export FAKE_RUNS="r1:42"
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_failure 42
  assert_line --partial "hpc: wandb run r1 checkpointed; exiting 42 (requeue me"
}

@test "the agent's own failure, with no run failing, is the task's exit code" {
  export FAKE_RUNS="" FAKE_AGENT_EXIT=5
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_failure 5
}

# functions: wandb_agent.sh without its last line (main "$@"), sourced.
functions() {
  sed '$d' "$WRAPPER" >"$BATS_TEST_TMPDIR/wandb_agent_functions.sh"
  cp "$REPO_ROOT"/hpc_files/node/lib.sh "$REPO_ROOT"/hpc_files/node/shared.sh "$BATS_TEST_TMPDIR/"
  # shellcheck source=/dev/null
  source "$BATS_TEST_TMPDIR/wandb_agent_functions.sh"
}

@test "agent_argv: --forward-signals right after 'agent', unless the user gave it" {
  functions
  agent_argv agent --count 1 sw1
  assert_equal "${argv[*]}" "wandb agent --forward-signals --count 1 sw1"
  agent_argv agent -f sw1
  assert_equal "${argv[*]}" "wandb agent -f sw1"
}

@test "runs_folder: \$scratch_dir/\$exp_name/runs, else runs/ in the trial folder" {
  functions
  run runs_folder
  assert_output "$scratch_dir/sweep/runs"
  unset scratch_dir
  run runs_folder
  assert_output "$HPC_TRIAL_DIR/runs"
}

@test "a run started by a launcher (torchrun) is tracked like python's: its exit code fails the task, its files go under runs/<run id>" {
  # A console script as pip writes it: an absolute interpreter, not python from PATH.
  cat >"$bin/torchrun" <<STUB
#!$(command -v python3)
import subprocess, sys
sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))
STUB
  chmod +x "$bin/torchrun"
  export FAKE_LAUNCHER=torchrun FAKE_RUNS="r1:3"
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_failure 3
  assert_equal "$stderr" "hpc: error: wandb run r1 exited with code 3 (wandb agent reported success)"
  assert_file_exists "$scratch_dir/$exp_name/runs/r1/ran"
  assert_file_not_exists "$HPC_TRIAL_DIR/ran"
}

@test "a python the run starts itself is not another run: one run recorded, with the run's own status" {
  export FAKE_RUNS="r1:3"
  # The run's program starts a python subprocess (through PATH, so the shim) that exits 0.
  sed -i 's|^import os, sys$|import os, subprocess, sys\nsubprocess.check_call(["python", "-c", "pass"])|' "$bin/wandb"
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_failure 3
  SLURM_ARRAY_JOB_ID=500 SLURM_JOB_ID=501 run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_equal "$(cat "$HPC_TRIAL_DIR/wandb_runs.txt")" $'r1 3 -\nr1 3 500'
}

@test "an agent that ran no run through the shims says so; it still exits 0 (a finished sweep has no work left)" {
  export FAKE_RUNS=""
  run --separate-stderr timeout 60 bash "$WRAPPER" agent --count 1 ent/proj/sw1
  assert_success
  assert_line --partial "hpc: wandb agent ended without a run through the toolkit's shims (python python3 torchrun accelerate deepspeed)"
}
