#!/usr/bin/env bats
# The docs against the code (tools/docs.py): docs/options.md is what --help
# prints, every option on a job_submitter.sh line is spelled as --help spells
# it, every site-profile key is documented, every relative link resolves, and
# every block marked 'bash runnable' runs (no cluster; the blocks marked
# 'bash runnable cluster' run in tests/bats/integration/docs.bats).

load '../test_helper'
load 'cli_helper'

DOCS="$REPO_ROOT/tools/docs.py"

setup() {
  cli_setup
}

@test "docs: options page, option spellings, site keys and links match the code" {
  run --separate-stderr python3 "$DOCS" check
  [[ -z "$stderr" ]] || fail "$stderr"
  assert_success
}

@test "docs: an option renamed in --help but not in the docs fails the check" {
  "$SUBMITTER" --help | sed 's/--signal-lead/--signal-lead-s/g' >"$BATS_TEST_TMPDIR/help.txt"
  run --separate-stderr python3 "$DOCS" check --help-file "$BATS_TEST_TMPDIR/help.txt"
  assert_failure
  [[ "$stderr" == *"--signal-lead is not an option of job_submitter.sh --help"* ]] ||
    fail "the renamed option was not reported: $stderr"
}

@test "docs: every block marked 'bash runnable' runs" {
  run python3 "$DOCS" run
  assert_success
  assert_line --regexp '^[1-9][0-9]* runnable block\(s\), 0 failed$'
}
