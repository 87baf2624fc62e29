#!/usr/bin/env bats
# --interactive on the local cluster, under a pseudo-terminal as a user would
# run it: the batch script's layout, staging and launcher in an salloc
# allocation, the output on the terminal; Ctrl-C ends the program (it
# checkpoints on SLURM's TERM), the keepers remove the node-local folders and
# the allocation is released.

load '../test_helper'

setup() {
  cluster_test_setup
  data=$(digits_dataset)
  pty_run=("$REPO_ROOT/.venv/bin/python" "$FIXTURES/programs/pty_run.py")
}

teardown() {
  cancel_test_jobs
}

# interrupted_run KIND: 2 nodes x 2 processes of the example training under
# --interactive, Ctrl-C typed at its first logged step; sets output, status
# and job (the allocation's id).
interrupted_run() {
  run "${pty_run[@]}" --timeout 240 --interrupt-after '^hpc_harness: step [0-9]+/' -- \
    "$SUBMITTER" --site local -p notmpdir -N 2 -g 2 -c 1 -W "$1" -t 10 -e "inter-$1" --interactive -- \
    python -m hpc_harness.train --data-dir "$data" --epochs 30 --step-sleep 0.05 --signal-check-every 1
  job=$(sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p' <<<"$output" | head -n 1)
  [[ -n "$job" ]] || fail "no allocation: $output"
}

# assert_cleaned_up: the program checkpointed at Ctrl-C, the run exited 130,
# no node-local folder of the allocation is left and it is no longer running.
assert_cleaned_up() {
  assert_equal "$status" 130
  assert_output --regexp 'hpc_harness: SIGTERM received: checkpointed at global step [0-9]+'
  assert_output --partial 'an interactive run is not requeued'
  assert_not_exist "$(local_tmpdir_base)/$(id -un)/$job"
  local state
  state=$(job_state "$job")
  [[ -z "$state" ]] || is_final_state "$state" || fail "allocation $job is still $state"
}

@test "--interactive, torchrun, 2 nodes x 2 processes: output on the terminal; Ctrl-C checkpoints, cleans the node-local folders, releases the allocation" {
  interrupted_run torchrun
  assert_output --partial 'hpc_harness: world_size=4'
  assert_output --partial 'hpc: node-local folders ready on 2 node(s)'
  assert_cleaned_up
}

@test "--interactive, lightning kind, 2 nodes x 2 processes: the same" {
  interrupted_run lightning
  assert_output --partial 'hpc_harness: world_size=4'
  assert_cleaned_up
}

@test "--interactive to the end: the program's exit code is the run's" {
  run "${pty_run[@]}" --timeout 120 -- "$SUBMITTER" --site local -p notmpdir -g 0 -W none -t 5 -e inter-exit --interactive -- \
    bash -c 'echo "on the terminal"; exit 3'
  assert_equal "$status" 3
  assert_output --partial 'on the terminal'
}
