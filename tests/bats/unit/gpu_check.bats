#!/usr/bin/env bats
# tools/gpu_check.sh refuses a python whose torch sees no GPU (the checks need one).

load '../test_helper'

@test "gpu_check.sh without a CUDA device exits 2 with one line and writes nothing" {
  local stub="$BATS_TEST_TMPDIR/python"
  printf '#!/bin/sh\nexit 1\n' >"$stub" # stands for a torch without CUDA
  chmod +x "$stub"
  PYTHON="$stub" run --separate-stderr "$REPO_ROOT/tools/gpu_check.sh" "$BATS_TEST_TMPDIR/out"
  assert_failure 2
  assert_equal "$stderr" "gpu_check: error: $stub's torch sees no CUDA device (PYTHON=... names a python whose torch has CUDA)"
  assert_equal "$output" ""
  [[ ! -e "$BATS_TEST_TMPDIR/out" ]]
}
