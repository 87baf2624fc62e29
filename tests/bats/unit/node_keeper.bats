#!/usr/bin/env bats
# hpc_files/node/keeper.sh run directly (no SLURM) where the site has no
# SLURM_TMPDIR: it must refuse <base>/<user> or <base>/<user>/<job> that is a
# link or not the user's own, report why, and touch nothing behind the link.
# (timeout: a keeper that accepted the folder would wait for the job to end.)

load '../test_helper'

setup() {
  sub="$BATS_TEST_TMPDIR/sub mission"
  base="$BATS_TEST_TMPDIR/shared base"
  elsewhere="$BATS_TEST_TMPDIR/someone else's"
  mkdir -p "$sub/node" "$base" "$elsewhere"
  cp "$REPO_ROOT"/hpc_files/node/*.sh "$sub/node/"
  export HPC_SUBMISSION_DIR="$sub" HPC_TMPDIR_MIMIC=1 HPC_TMPDIR_BASE="$base"
  export USER=alice SLURM_JOB_ID=77 SLURMD_NODENAME=nodeA
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID HPC_DATA_TARBALL HPC_STAGE_OUT
}

@test "a symlinked <base>/<user> is refused and reported; nothing is made behind it" {
  ln -s "$elsewhere" "$base/alice"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: $base/alice is a symlink; refusing to use it (remove it, or ask whoever made it)"
  assert_equal "$(cat "$sub/runs/77/stage/nodeA.failed")" "$base/alice is a symlink; refusing to use it (remove it, or ask whoever made it)"
  assert_equal "$(ls -A "$elsewhere")" ""
}

@test "a symlinked <base>/<user>/<job> is refused; the folder it points at survives" {
  mkdir -m 0700 "$base/alice"
  mkdir "$elsewhere/nodeA"
  : >"$elsewhere/nodeA/precious"
  ln -s "$elsewhere" "$base/alice/77"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: $base/alice/77 is a symlink; refusing to use it (remove it, or ask whoever made it)"
  assert_file_exists "$elsewhere/nodeA/precious"
}

@test "a <base>/<user> owned by another user is refused" {
  [[ $(id -u) == 0 ]] || skip "needs root to make a folder owned by someone else"
  mkdir "$base/alice"
  chown nobody "$base/alice"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: $base/alice is owned by nobody, not by $(id -un); refusing to use it"
}

@test "a base other users may rename in (0777, no sticky bit) is refused" {
  chmod 0777 "$base"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: $base is writable by other users without the sticky bit (mode 777), so they could swap the folders in it; ask the admins to chmod +t it, or pick another tmpdir_base"
  assert_not_exist "$base/alice"
}
