#!/usr/bin/env bats
# hpc_files/lib/render.sh: the small writers the batch script is made of, and
# whole scripts rendered from the golden plans alone. (tests/bats/cli/render.bats
# compares what the submitter renders from its options with the same files.)

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/render.sh
source "$HPC_FILES_DIR/lib/render.sh"

@test "sbatch_line: a plain argument" {
  run sbatch_line --exclusive
  assert_output "#SBATCH --exclusive"
  run sbatch_line --constraint=ib
  assert_output "#SBATCH --constraint=ib"
}

@test "sbatch_line: a value with spaces is double-quoted" {
  run sbatch_line "--comment=two words"
  assert_output '#SBATCH --comment="two words"'
  # Given as separate words, as on sbatch's command line ('--comment two words').
  run sbatch_line "--comment two words"
  assert_output '#SBATCH --comment="two words"'
}

@test "sbatch_line: a short option's value is its own word, as sbatch reads it" {
  run sbatch_line "-w node1"
  assert_output '#SBATCH -w "node1"'
  run sbatch_line "-D /tmp/a b"
  assert_output '#SBATCH -D "/tmp/a b"'
  run sbatch_line -wnode1
  assert_output '#SBATCH -wnode1'
}

@test "export_line quotes the value so the node reads it literally" {
  local line
  run export_line X 'a b'
  assert_output "export X='a b'"
  line=$(export_line X "\$(touch $BATS_TEST_TMPDIR/pwned) it's")
  eval "$line"
  assert_equal "$X" "\$(touch $BATS_TEST_TMPDIR/pwned) it's"
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}

@test "render.sh reads the plan only: it names no opt_* or site_* variable" {
  run grep -nE '\b(opt|site)_[a-z]' "$HPC_FILES_DIR/lib/render.sh"
  assert_failure 1
}

@test "golden: each plan fixture alone renders its golden script, byte for byte" {
  local plan name rendered
  for plan in "$FIXTURES"/golden/*.plan; do
    name=${plan##*/}
    name=${name%.plan}
    rendered="$BATS_TEST_TMPDIR/$name.sbatch"
    # A fresh bash with -u: the renderer and the plan, nothing else.
    env -i PATH="$PATH" LC_ALL=C bash -uc 'set -eo pipefail
      source "$1/lib/common.sh"
      source "$1/lib/options.sh"
      source "$1/lib/render.sh"
      source "$2"
      render_script' _ "$HPC_FILES_DIR" "$plan" >"$rendered" || fail "rendering $name.plan failed"
    cmp -s "$rendered" "$FIXTURES/golden/$name.sbatch" ||
      fail "$name.plan does not render $name.sbatch (if intended: make golden):
$(diff -u "$FIXTURES/golden/$name.sbatch" "$rendered")"
  done
  [[ -n "${name:-}" ]] || fail "no plan fixtures in $FIXTURES/golden"
}
