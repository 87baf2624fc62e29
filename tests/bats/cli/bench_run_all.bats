#!/usr/bin/env bats
# bench/run_all.sh --cluster: a bad value or none is refused in one line,
# before any benchmark runs.

load '../test_helper'

@test "run_all.sh --cluster takes yes or no; anything else, or nothing, is refused in one line" {
  run --separate-stderr "$REPO_ROOT/bench/run_all.sh" --smoke --cluster maybe --out "$BATS_TEST_TMPDIR/out.md"
  assert_failure 1
  assert_equal "$stderr" "run_all.sh: error: --cluster expects yes or no, got 'maybe'"
  assert_output ''
  run --separate-stderr "$REPO_ROOT/bench/run_all.sh" --smoke --cluster
  assert_failure
  assert_equal "${#stderr_lines[@]}" 1
  assert_regex "$stderr" '--cluster expects yes or no$'
  [[ ! -e "$BATS_TEST_TMPDIR/out.md" ]]
}
