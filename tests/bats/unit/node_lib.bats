#!/usr/bin/env bats
# hpc_files/node/lib.sh: functions shared by the node-side scripts, called
# directly (the file only defines functions).

load '../test_helper'

# in_lib CODE: run CODE (set -euo pipefail) after sourcing node/lib.sh.
in_lib() {
  run --separate-stderr bash -c 'set -euo pipefail
    source "$1/hpc_files/node/lib.sh"
    eval "$2"' _ "$REPO_ROOT" "$1"
}

setup() {
  base="$BATS_TEST_TMPDIR/shared base"
  mkdir -p "$base"
  export base
}

@test "private_dir creates a missing folder with mode 0700" {
  in_lib 'private_dir "$base/me"; private_dir "$base/me/123"; stat -c %a "$base/me" "$base/me/123"'
  assert_success
  assert_equal "$output" $'700\n700'
}

@test "private_dir keeps an own folder and makes it private" {
  mkdir -m 0755 "$base/me"
  in_lib 'private_dir "$base/me"; stat -c %a "$base/me"'
  assert_success
  assert_output 700
}

@test "private_dir refuses a symlinked folder, even one pointing at an own folder" {
  mkdir "$BATS_TEST_TMPDIR/elsewhere"
  ln -s "$BATS_TEST_TMPDIR/elsewhere" "$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me is a symlink; refusing to use it (remove it, or ask whoever made it)"
  ln -s "$BATS_TEST_TMPDIR/nowhere" "$base/dangling"
  in_lib 'private_dir "$base/dangling"'
  assert_failure 1
  assert_file_not_exists "$BATS_TEST_TMPDIR/nowhere"
}

@test "private_dir refuses a file in the folder's place" {
  : >"$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me exists and is not a folder; refusing to use it"
}

@test "private_dir refuses a folder owned by another user" {
  [[ $(id -u) == 0 ]] || skip "needs root to make a folder owned by someone else"
  mkdir "$base/me"
  chown nobody "$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me is owned by nobody, not by $(id -un); refusing to use it"
}
