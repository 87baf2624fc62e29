#!/usr/bin/env bats
# hpc_files/lib/render.sh: the small writers the batch script is made of.
# (Whole scripts are compared with golden files in tests/bats/cli/render.bats.)

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

@test "export_line quotes the value so the node reads it literally" {
  local line
  run export_line X 'a b'
  assert_output "export X='a b'"
  line=$(export_line X "\$(touch $BATS_TEST_TMPDIR/pwned) it's")
  eval "$line"
  assert_equal "$X" "\$(touch $BATS_TEST_TMPDIR/pwned) it's"
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}
