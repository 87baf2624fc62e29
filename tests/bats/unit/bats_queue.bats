#!/usr/bin/env bats
# tools/bats_queue.sh: make test's integration files from one queue that
# the runners on both local clusters share.

load '../test_helper'

setup() {
  dir="$BATS_TEST_TMPDIR/suite"
  mkdir -p "$dir"
  for name in a b c d; do
    printf '@test "%s" { echo "%s ran" >>"%s"; }\n' "$name" "$name" "$BATS_TEST_TMPDIR/ran" >"$dir/$name.bats"
  done
  printf '# slow ones first\nc.bats\nd.bats\n' >"$BATS_TEST_TMPDIR/order"
  queue="$BATS_TEST_TMPDIR/queue"
}

@test "init: the files the order names first, in its order, then the others in theirs" {
  run "$REPO_ROOT/tools/bats_queue.sh" init "$queue" "$BATS_TEST_TMPDIR/order" "$dir"/*.bats
  assert_success
  assert_equal "$(cat "$queue")" "$dir/c.bats
$dir/d.bats
$dir/a.bats
$dir/b.bats"
  printf 'gone.bats\n' >>"$BATS_TEST_TMPDIR/order"
  run --separate-stderr "$REPO_ROOT/tools/bats_queue.sh" init "$queue" "$BATS_TEST_TMPDIR/order" "$dir"/*.bats
  assert_failure 2
  assert_equal "$stderr" "bats_queue.sh: error: $BATS_TEST_TMPDIR/order names gone.bats, which is not among the files given"
}

@test "run: two runners at once run every file once between them; a failed file fails its runner" {
  "$REPO_ROOT/tools/bats_queue.sh" init "$queue" "$BATS_TEST_TMPDIR/order" "$dir"/*.bats
  "$REPO_ROOT/tools/bats_queue.sh" run "$queue" first >"$BATS_TEST_TMPDIR/first.out" &
  "$REPO_ROOT/tools/bats_queue.sh" run "$queue" second >"$BATS_TEST_TMPDIR/second.out"
  wait $!
  run sort "$BATS_TEST_TMPDIR/ran"
  assert_output "a ran
b ran
c ran
d ran"
  run grep -ch '^# [a-z]*: .*took' "$BATS_TEST_TMPDIR/first.out" "$BATS_TEST_TMPDIR/second.out"
  assert_equal "$(($(paste -sd+ <<<"$output")))" 4
  printf '@test "fails" { false; }\n' >"$dir/b.bats"
  "$REPO_ROOT/tools/bats_queue.sh" init "$queue" "$BATS_TEST_TMPDIR/order" "$dir"/*.bats
  run "$REPO_ROOT/tools/bats_queue.sh" run "$queue" first
  assert_failure 1
  assert_output --partial "not ok 1 fails"
  assert_output --partial "# first: $dir/a.bats took"
}
