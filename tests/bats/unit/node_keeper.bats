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

# data_tarball: a tarball of two files and its .meta, as the submitter writes
# them; SLURM_TMPDIR is a folder of the test's (no mimic folder).
data_tarball() {
  local src="$BATS_TEST_TMPDIR/src"
  mkdir -p "$src/ds one" "$BATS_TEST_TMPDIR/cache" "$BATS_TEST_TMPDIR/node tmp"
  printf 'a\n' >"$src/ds one/a.txt"
  printf 'b\n' >"$src/ds one/b.txt"
  tarball="$BATS_TEST_TMPDIR/cache/data-0123.tar"
  tar -C "$src" -cf "$tarball" "ds one"
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tarball")" 4 >"$tarball.meta"
  export HPC_TMPDIR_MIMIC=0 SLURM_TMPDIR="$BATS_TEST_TMPDIR/node tmp" HPC_DATA_TARBALL="$tarball"
}

@test "extract_data: a complete tarball is extracted into SLURM_TMPDIR and the node reports ok" {
  data_tarball
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_success
  assert_output --regexp "^hpc: nodeA: staged data-0123.tar into $SLURM_TMPDIR in [0-9]+ s$"
  assert_equal "$(cat "$SLURM_TMPDIR/ds one/b.txt")" b
  assert_equal "$(cat "$sub/runs/77/stage/nodeA.ok")" "$SLURM_TMPDIR"
}

@test "extract_data: a tarball whose size is not the one in its .meta is refused, nothing extracted" {
  data_tarball
  printf 'tarball_bytes=99\ncontent_bytes=4\n' >"$tarball.meta"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: data tarball $tarball is $(stat -c %s "$tarball") bytes but was built as 99 bytes (truncated or replaced); resubmit to rebuild it"
  assert_file_exists "$sub/runs/77/stage/nodeA.failed"
  assert_not_exist "$SLURM_TMPDIR/ds one"
}

@test "extract_data: data larger than the free space in SLURM_TMPDIR is refused (content_bytes of the .meta)" {
  data_tarball
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tarball")" 999999999999999999 >"$tarball.meta"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_regex "$stderr" "^hpc: error: nodeA: not enough space in $SLURM_TMPDIR: the data needs 999999999999999999 bytes, [0-9]+ bytes are free$"
  assert_not_exist "$SLURM_TMPDIR/ds one"
}

@test "extract_data: a tarball without its .meta (never completed) is refused" {
  data_tarball
  rm "$tarball.meta"
  run --separate-stderr timeout 20 bash "$sub/node/keeper.sh"
  assert_failure 1
  assert_equal "$stderr" "hpc: error: nodeA: data tarball $tarball has no .meta file (it was never completed)"
}

# keeper_until_ok: start keeper.sh in the background (keeper_pid) and wait
# for its '<node>.ok'.
keeper_until_ok() {
  bash "$sub/node/keeper.sh" >"$BATS_TEST_TMPDIR/keeper.out" 2>&1 &
  keeper_pid=$!
  local deadline=$((SECONDS + 20))
  until [[ -f "$sub/runs/77/stage/nodeA.ok" ]]; do
    ((SECONDS < deadline)) || fail "no nodeA.ok: $(cat "$BATS_TEST_TMPDIR/keeper.out")"
    sleep 0.1
  done
}

# wait_keeper: until the keeper started by keeper_until_ok has exited (20 s
# at most; then it and its sleep are killed and the test fails).
wait_keeper() {
  local deadline=$((SECONDS + 20))
  while kill -0 "$keeper_pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      pkill -KILL -P "$keeper_pid" || true
      kill -KILL "$keeper_pid" || true
      fail "the keeper did not end: $(cat "$BATS_TEST_TMPDIR/keeper.out")"
    fi
    sleep 0.1
  done
}

@test "stage_out: at USR2 (the job's end) the keeper copies the stage-out folder into the trial folder, per node on several nodes" {
  mkdir -p "$BATS_TEST_TMPDIR/node tmp"
  export HPC_TMPDIR_MIMIC=0 SLURM_TMPDIR="$BATS_TEST_TMPDIR/node tmp" HPC_STAGE_OUT=results
  export HPC_TRIAL_DIR="$BATS_TEST_TMPDIR/trial dir" SLURM_JOB_NUM_NODES=2
  keeper_until_ok
  mkdir -p "$SLURM_TMPDIR/results/sub"
  printf 'r\n' >"$SLURM_TMPDIR/results/sub/out.txt"
  kill -USR2 "$keeper_pid"
  wait_keeper
  assert_equal "$(cat "$HPC_TRIAL_DIR/results/nodeA/sub/out.txt")" r
  assert_file_contains "$BATS_TEST_TMPDIR/keeper.out" "hpc: nodeA: staged out results to $HPC_TRIAL_DIR/results/nodeA"
  # The site's SLURM_TMPDIR is not the keeper's to remove.
  assert_dir_exists "$SLURM_TMPDIR/results"
}

@test "finish: the mimic folder the keeper made is removed when the job ends (USR2), and only that" {
  keeper_until_ok
  assert_dir_exists "$base/alice/77/nodeA"
  : >"$base/alice/77/nodeA/tmpfile"
  kill -s USR2 "$keeper_pid"
  wait_keeper
  assert_not_exist "$base/alice/77"
  assert_dir_exists "$base/alice"
  assert_file_contains "$BATS_TEST_TMPDIR/keeper.out" "hpc: nodeA: removed $base/alice/77/nodeA"
}

# stub_scontrol KILLWAIT GRACETIME: scontrol answers 'show config' and 'show
# partition' with these.
stub_scontrol() {
  local bin="$BATS_TEST_TMPDIR/scontrol-bin"
  mkdir -p "$bin"
  cat >"$bin/scontrol" <<STUB
#!/usr/bin/env bash
case "\$2" in
  config) printf 'KeepAliveTime           = SYSTEM_DEFAULT\nKillWait                = $1 sec\n' ;;
  partition) printf 'PartitionName=p AllowGroups=ALL GraceTime=$2 Hidden=NO\n' ;;
esac
STUB
  chmod +x "$bin/scontrol"
  PATH="$bin:$PATH"
}

@test "TERM (cancel, preemption): the program keeps the folder in its grace time; stage-out and removal follow its end" {
  stub_scontrol 20 0
  export HPC_STAGE_OUT=results HPC_TRIAL_DIR="$BATS_TEST_TMPDIR/trial"
  keeper_until_ok
  mkdir -p "$base/alice/77/nodeA/results"
  kill -s TERM "$keeper_pid"
  # The program's TERM handler: reads, and writes for a while.
  sleep 2
  assert_dir_exists "$base/alice/77/nodeA/results"
  printf 'late\n' >"$base/alice/77/nodeA/results/late.txt"
  # batch.sh, once the training step ended.
  : >"$sub/runs/77/stage/stop"
  wait_keeper
  assert_equal "$(cat "$HPC_TRIAL_DIR/results/late.txt")" late
  assert_not_exist "$base/alice/77"
  assert_file_contains "$BATS_TEST_TMPDIR/keeper.out" "hpc: nodeA: SIGTERM; waiting for the program to end (at most 17 s) before the stage-out and cleanup"
}

@test "TERM: a program still running near SLURM's SIGKILL (the larger of KillWait and GraceTime) is not waited for longer" {
  stub_scontrol 2 5
  keeper_until_ok
  kill -s TERM "$keeper_pid"
  wait_keeper
  assert_not_exist "$base/alice/77"
  assert_file_contains "$BATS_TEST_TMPDIR/keeper.out" "hpc: nodeA: the program still runs 5 s after SIGTERM, close to SLURM's SIGKILL; staging out and cleaning up now"
}

@test "finish: the keeper ends on the stop file alone (a USR2 that srun did not forward is not needed)" {
  keeper_until_ok
  assert_dir_exists "$base/alice/77/nodeA"
  : >"$sub/runs/77/stage/stop"
  wait_keeper
  assert_not_exist "$base/alice/77"
  assert_file_contains "$BATS_TEST_TMPDIR/keeper.out" "hpc: nodeA: removed $base/alice/77/nodeA"
}

@test "finish: a TERM during the stage-out after USR2 (a cancel as the job ends) does not cut the stage-out or the removal short" {
  # cp stands in for a long stage-out: it says it started, then takes 2 s.
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  cat >"$bin/cp" <<STUB
#!/usr/bin/env bash
: >"$BATS_TEST_TMPDIR/cp started"
sleep 2
exec $(command -v cp) "\$@"
STUB
  chmod +x "$bin/cp"
  export HPC_STAGE_OUT=results HPC_TRIAL_DIR="$BATS_TEST_TMPDIR/trial"
  PATH="$bin:$PATH" keeper_until_ok
  mkdir -p "$base/alice/77/nodeA/results"
  printf 'r\n' >"$base/alice/77/nodeA/results/out.txt"
  kill -s USR2 "$keeper_pid"
  local deadline=$((SECONDS + 20))
  until [[ -e "$BATS_TEST_TMPDIR/cp started" ]]; do
    ((SECONDS < deadline)) || fail "the stage-out did not start: $(cat "$BATS_TEST_TMPDIR/keeper.out")"
    sleep 0.05
  done
  kill -s TERM "$keeper_pid"
  wait_keeper
  assert_equal "$(cat "$HPC_TRIAL_DIR/results/out.txt")" r
  assert_not_exist "$base/alice/77"
}

@test "another node of the job removing the shared <base>/<user>/<job> meanwhile: the keeper makes it again and stages" {
  # Nodes sharing the disk (the local cluster's two nodes) share <job>; one
  # whose staging failed removes it once empty. chmod stands in for that
  # moment: the first time it is asked to make <job> private, <job> is gone.
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin" "$base/alice"
  cat >"$bin/chmod" <<STUB
#!/usr/bin/env bash
if [[ "\${*: -1}" == "$base/alice/77" && ! -e "$BATS_TEST_TMPDIR/vanished" ]]; then
  : >"$BATS_TEST_TMPDIR/vanished"
  rmdir -- "$base/alice/77"
  exit 1
fi
exec $(command -v chmod) "\$@"
STUB
  /bin/chmod +x "$bin/chmod"
  PATH="$bin:$PATH" keeper_until_ok
  assert_file_exists "$BATS_TEST_TMPDIR/vanished"
  assert_dir_exists "$base/alice/77/nodeA"
  kill -s USR2 "$keeper_pid"
  wait_keeper
}
