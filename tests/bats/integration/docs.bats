#!/usr/bin/env bats
# The docs' blocks marked 'bash runnable cluster' (tools/docs.py run --cluster),
# each run as one script from the repository root against the local cluster.

load '../test_helper'

setup() {
  cluster_test_setup
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  unset HPC_SITE
}

@test "docs: every block marked 'bash runnable cluster' runs on the local cluster" {
  run python3 "$REPO_ROOT/tools/docs.py" run --cluster --timeout 240
  assert_success
  assert_line --regexp '^[1-9][0-9]* runnable block\(s\), 0 failed$'
}
