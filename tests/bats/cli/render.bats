#!/usr/bin/env bats
# The --dry-run batch script, compared with the golden files in
# tests/bats/fixtures/golden/. The cases (name -> submitter arguments) live in
# fixtures/golden/cases.bash, shared with regenerate.sh. After an intended
# change to the rendering: make golden (tests/bats/fixtures/golden/regenerate.sh),
# then review the diff.

load '../test_helper'
load 'cli_helper'

GOLDEN_DIR="$FIXTURES/golden"
GOLDEN_REPO=$REPO_ROOT
# shellcheck source=../fixtures/golden/cases.bash
source "$GOLDEN_DIR/cases.bash"

setup() {
  cli_setup
}

# matches_golden NAME: the rendered script equals NAME.sbatch, byte for byte.
matches_golden() {
  local name=$1 rendered="$BATS_TEST_TMPDIR/$1.sbatch"
  [[ -f "$GOLDEN_DIR/$name.sbatch" ]] || fail "no golden file $name.sbatch; run tests/bats/fixtures/golden/regenerate.sh"
  golden_render "$name" >"$rendered" || fail "rendering case '$name' failed"
  cmp -s "$rendered" "$GOLDEN_DIR/$name.sbatch" ||
    fail "case '$name' differs from its golden file (if intended: make golden):
$(diff -u "$GOLDEN_DIR/$name.sbatch" "$rendered")"
}

@test "golden: lightning_2x2" {
  matches_golden lightning_2x2
}

@test "golden: torchrun_2x2" {
  matches_golden torchrun_2x2
}

@test "golden: cpu_only" {
  matches_golden cpu_only
  run grep -c -- '--gres' "$GOLDEN_DIR/cpu_only.sbatch"
  assert_output 0
}

@test "golden: configs_array" {
  matches_golden configs_array
}

@test "golden: seeds_throttle" {
  matches_golden seeds_throttle
}

@test "golden: sweep_array" {
  [[ -f "$REPO_ROOT/sweeper.yml" ]] || fail "the repository's sweeper.yml is missing"
  matches_golden sweep_array
}

@test "golden: wandb_sweep" {
  matches_golden wandb_sweep
}

@test "golden: singularity" {
  matches_golden singularity
}

@test "golden: site_local" {
  matches_golden site_local
}

@test "golden: site_cedar" {
  matches_golden site_cedar
}

@test "golden: sbatch_arg" {
  matches_golden sbatch_arg
}

@test "golden: dependency" {
  matches_golden dependency
}

@test "golden: modules" {
  matches_golden modules
}

# --wandb-sync login over a site (cedar) whose env already sets WANDB_MODE.
@test "golden: wandb_sync" {
  matches_golden wandb_sync
}

@test "every case has a test here and a golden file, and every golden file a case" {
  local name file tests
  tests=$(sed -n 's/^@test "golden: \(.*\)" {$/\1/p' "$BATS_TEST_FILENAME")
  for name in "${GOLDEN_CASES[@]}"; do
    grep -qx -- "$name" <<<"$tests" || fail "case '$name' has no @test in render.bats"
    assert_file_exists "$GOLDEN_DIR/$name.sbatch"
  done
  for file in "$GOLDEN_DIR"/*.sbatch; do
    name=${file##*/}
    name=${name%.sbatch}
    [[ " ${GOLDEN_CASES[*]} " == *" $name "* ]] || fail "golden file $name.sbatch has no case in cases.bash"
  done
  while IFS= read -r name; do
    [[ " ${GOLDEN_CASES[*]} " == *" $name "* ]] || fail "@test 'golden: $name' has no case in cases.bash"
  done <<<"$tests"
}

@test "rendering is byte-stable: the same options twice give the same bytes" {
  local name
  for name in configs_array sweep_array singularity; do
    golden_args "$name"
    "$SUBMITTER" --dry-run "${golden_argv[@]}" >"$BATS_TEST_TMPDIR/first" </dev/null
    "$SUBMITTER" --dry-run "${golden_argv[@]}" >"$BATS_TEST_TMPDIR/second" </dev/null
    cmp "$BATS_TEST_TMPDIR/first" "$BATS_TEST_TMPDIR/second" || fail "case '$name' rendered differently twice"
  done
}

@test "rendering does not depend on the current directory" {
  golden_args lightning_2x2
  "$SUBMITTER" --dry-run "${golden_argv[@]}" >"$BATS_TEST_TMPDIR/here" </dev/null
  (cd / && "$SUBMITTER" --dry-run "${golden_argv[@]}") >"$BATS_TEST_TMPDIR/root" </dev/null
  cmp "$BATS_TEST_TMPDIR/here" "$BATS_TEST_TMPDIR/root"
}

@test "--dry-run creates nothing under SCRATCH and calls no sbatch" {
  local before name
  mkdir -p "$SCRATCH/$PROJECT/ds"
  before=$(scratch_listing)
  for name in "${GOLDEN_CASES[@]}"; do
    golden_args "$name"
    "$SUBMITTER" --dry-run "${golden_argv[@]}" >/dev/null </dev/null
  done
  "$SUBMITTER" --dry-run -C "$ONE_LINE" -d ds >/dev/null </dev/null
  assert_equal "$(scratch_listing)" "$before"
  assert_file_not_exists "$STUB_SBATCH_LOG"
}

@test "--dry-run with a fresh SCRATCH does not create it" {
  export SCRATCH="$BATS_TEST_TMPDIR/not yet"
  dry -C "$THREE_LINES"
  assert_file_not_exists "$SCRATCH"
}

@test "the rendered script is valid bash" {
  local name
  for name in "${GOLDEN_CASES[@]}"; do
    bash -n "$GOLDEN_DIR/$name.sbatch" || fail "$name.sbatch is not valid bash"
  done
}

@test "CPU-only Lightning (-g 0): one task per node by default, --tasks-per-node K tasks, no GRES" {
  dry -W lightning -g 0 -n 2 -c 3 -C "$ONE_LINE"
  assert_line '#SBATCH --ntasks-per-node=1'
  assert_line '#SBATCH --cpus-per-task=3'
  refute_line --partial '--gres'
  dry -W lightning -g 0 -n 2 -c 3 --tasks-per-node 2 -C "$ONE_LINE"
  assert_line '#SBATCH --ntasks-per-node=2'
  assert_line 'export HPC_PROCS_PER_NODE=2'
  dry -W torchrun -g 0 -n 2 -c 3 --tasks-per-node 2 -C "$ONE_LINE"
  assert_line '#SBATCH --ntasks-per-node=1'
  assert_line '#SBATCH --cpus-per-task=6'
  assert_line 'export HPC_PROCS_PER_NODE=2'
}

@test "--signal USR2 asks SLURM for USR2; --no-signal asks for none; both keep --requeue" {
  dry --signal SIGUSR2 --signal-lead 120 -C "$ONE_LINE"
  assert_line '#SBATCH --signal=B:USR2@120'
  assert_line 'export HPC_SIGNAL=USR2'
  dry --no-signal -C "$ONE_LINE"
  refute_line --partial '#SBATCH --signal'
  assert_line "export HPC_SIGNAL=''"
  assert_line '#SBATCH --requeue'
}
