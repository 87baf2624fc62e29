#!/usr/bin/env bats
# plai_cleanups/cleanup_node.sh run directly against a planted tree with a fake
# squeue, and submit_plai_cleanup's options and --print with a fake sinfo (no
# cluster needed; the real-cluster run is in ../integration/cleanup.bats).

load '../test_helper'

CLEANUP_NODE="$REPO_ROOT/plai_cleanups/cleanup_node.sh"
SUBMIT_CLEANUP="$REPO_ROOT/plai_cleanups/submit_plai_cleanup"

setup() {
  export USER=alice
  bin="$BATS_TEST_TMPDIR/fake bin"
  mkdir -p "$bin"
  # squeue prints the lines of $FAKE_SQUEUE_IDS and logs its argv (and the
  # SQUEUE_* variables it saw, in $FAKE_SQUEUE_LOG.env); it fails with
  # $FAKE_SQUEUE_EXIT if set. sinfo logs likewise.
  export FAKE_SQUEUE_IDS="$BATS_TEST_TMPDIR/squeue ids"
  export FAKE_SQUEUE_LOG="$BATS_TEST_TMPDIR/squeue.log"
  cat >"$bin/squeue" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$FAKE_SQUEUE_LOG"
env | grep '^SQUEUE_' | sort >>"$FAKE_SQUEUE_LOG.env" || true
[[ -z "${FAKE_SQUEUE_EXIT:-}" ]] || { echo "squeue: error: fake failure" >&2; exit "$FAKE_SQUEUE_EXIT"; }
cat "$FAKE_SQUEUE_IDS"
STUB
  # sinfo prints $FAKE_SINFO_OUT (node lines); sbatch must never run in these tests.
  cat >"$bin/sinfo" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$FAKE_SINFO_LOG"
env | grep '^SINFO_' | sort >>"$FAKE_SINFO_LOG.env" || true
printf '%s' "$FAKE_SINFO_OUT"
STUB
  export FAKE_SINFO_LOG="$BATS_TEST_TMPDIR/sinfo.log"
  printf '#!/bin/sh\necho "sbatch must not run" >&2\nexit 99\n' >"$bin/sbatch"
  chmod +x "$bin/squeue" "$bin/sinfo" "$bin/sbatch"
  export PATH="$bin:$PATH"
  export SLURMD_NODENAME=nodeA
  printf '%s\n' 100 '300_[5-9]' 300_2 3011_2 '  777  ' >"$FAKE_SQUEUE_IDS"

  base="$BATS_TEST_TMPDIR/base/local ssd"
  me="$base/alice"
  outside="$BATS_TEST_TMPDIR/outside"
  plant
}

plant() {
  mkdir -p "$me/100/nodeA" "$me/200/nodeA/my data" "$me/300_4/nodeA" "$me/301_1/nodeA" \
    "$me/600/nodeB" "$me/800/nodeA" "$me/777/nodeA" "$me/foo/nodeA" "$me/123abc/nodeA" "$me/0123/nodeA" \
    "$me/\$(touch pwned)" "$base/otheruser/999/nodeA" "$outside/target" "$outside/target700"
  echo live >"$me/100/nodeA/data.txt"
  echo gone >"$me/200/nodeA/my data/f.txt"
  echo live >"$me/300_4/nodeA/data.txt"
  echo gone >"$me/301_1/nodeA/f.txt"
  echo keep >"$me/800/notes.txt"
  echo theirs >"$base/otheruser/999/nodeA/f.txt"
  echo precious >"$outside/target/f.txt"
  echo precious >"$outside/target700/f.txt"
  ln -s "$outside/target" "$me/400"           # a symlink named like a job id
  mkdir -p "$me/700"
  ln -s "$outside/target700" "$me/700/nodeA"  # a finished job whose node folder is a symlink
  echo file >"$me/500"                        # a file named like a job id
}

# tree: every path under the test folder, sorted (to compare before/after).
tree() {
  (cd "$BATS_TEST_TMPDIR" && find base outside -print | LC_ALL=C sort)
}

@test "cleanup_node.sh removes only the folders of jobs that left squeue, and says why for each" {
  cd "$BATS_TEST_TMPDIR"
  run --separate-stderr "$CLEANUP_NODE" --base "$base"
  assert_success
  assert_equal "$stderr" ""
  # Removed: the finished job 200 (with a space inside), the finished array task 301_1.
  assert_not_exist "$me/200"
  assert_not_exist "$me/301_1"
  assert_line "nodeA: removed $me/200/nodeA (job 200 is not in squeue)"
  assert_line "nodeA: removed $me/200 (job 200 is not in squeue; empty)"
  assert_line "nodeA: removed $me/301_1/nodeA (job 301 is not in squeue)"
  assert_line "nodeA: removed $me/301_1 (job 301 is not in squeue; empty)"
  # Kept: live job, live array (pending tasks 300_[5-9]), id with spaces around.
  assert_file_exist "$me/100/nodeA/data.txt"
  assert_file_exist "$me/300_4/nodeA/data.txt"
  assert_dir_exist "$me/777/nodeA"
  assert_line "nodeA: kept $me/100 (job 100 is in squeue)"
  assert_line "nodeA: kept $me/300_4 (job 300 is in squeue)"
  assert_line "nodeA: kept $me/777 (job 777 is in squeue)"
  # The symlink is not followed: it, its target and the content survive.
  assert_link_exist "$me/400"
  assert_file_exist "$outside/target/f.txt"
  assert_line "nodeA: kept $me/400 (a symlink; not followed)"
  # A finished job whose node folder is a symlink: the link and target stay.
  assert_link_exist "$me/700/nodeA"
  assert_file_exist "$outside/target700/f.txt"
  assert_line "nodeA: kept $me/700/nodeA (a symlink; not followed)"
  assert_line "nodeA: kept $me/700 (job 700 is not in squeue, but the folder holds nodeA)"
  # A file named like a job id; names that are not job keys.
  assert_file_exist "$me/500"
  assert_line "nodeA: kept $me/500 (not a folder)"
  assert_dir_exist "$me/foo/nodeA"
  assert_dir_exist "$me/123abc/nodeA"
  assert_dir_exist "$me/0123/nodeA"
  assert_line "nodeA: kept $me/foo (not a job key)"
  assert_line "nodeA: kept $me/123abc (not a job key)"
  assert_line "nodeA: kept $me/0123 (not a job key)"
  assert_line "nodeA: kept $me/\$(touch pwned) (not a job key)"
  assert_not_exist "$BATS_TEST_TMPDIR/pwned"
  # Another node's folder of a finished job (shared disk) is not this node's.
  assert_dir_exist "$me/600/nodeB"
  assert_line "nodeA: kept $me/600 (job 600 is not in squeue, but the folder holds nodeB)"
  # Only the node's own folder goes; other content keeps the key folder.
  assert_not_exist "$me/800/nodeA"
  assert_file_exist "$me/800/notes.txt"
  assert_line "nodeA: kept $me/800 (job 800 is not in squeue, but the folder holds notes.txt)"
  # Another user's folder is never read.
  assert_file_exist "$base/otheruser/999/nodeA/f.txt"
  refute_output --partial otheruser
  assert_line "nodeA: 5 removed, 13 kept, 0 failed"
  # squeue was asked about this user only.
  assert_equal "$(cat "$FAKE_SQUEUE_LOG")" "-u alice -h -t all -o %i"
}

@test "cleanup_node.sh asks squeue for every state, whatever SQUEUE_* the job inherited" {
  # Inherited through --export=ALL from the submitting shell: each would hide
  # live jobs (and so lose their folders) if squeue honoured it.
  export SQUEUE_STATES=PENDING SQUEUE_PARTITION=other SQUEUE_FORMAT=%j SQUEUE_USERS=bob SQUEUE_ARRAY=1
  run --separate-stderr "$CLEANUP_NODE" --base "$base" --dry-run
  assert_success
  assert_equal "$(cat "$FAKE_SQUEUE_LOG")" "-u alice -h -t all -o %i"
  assert_equal "$(cat "$FAKE_SQUEUE_LOG.env")" ""
}

@test "submit_plai_cleanup lists nodes whatever SINFO_* the shell holds" {
  export SINFO_PARTITION=other SINFO_FORMAT=%P SINFO_SORT=-N
  export FAKE_SINFO_OUT=$'node1 idle notmpdir\n'
  run --separate-stderr "$SUBMIT_CLEANUP" --base "$base" -p notmpdir --print
  assert_success
  assert_equal "$(cat "$FAKE_SINFO_LOG.env")" ""
}

@test "cleanup_node.sh --dry-run deletes nothing and lists exactly what a real run removes" {
  local before after would removed
  before=$(tree)
  run --separate-stderr "$CLEANUP_NODE" --base "$base" --dry-run
  assert_success
  after=$(tree)
  assert_equal "$after" "$before"
  assert_line --index 0 "nodeA: cleaning $me, dry run (job ids in squeue: 100 300 777 3011)"
  assert_line "nodeA: dry run: 5 would be removed, 13 kept"
  would=$(sed -n 's/^nodeA: would remove \(.*\) (.*)$/\1/p' <<<"$output")
  run "$CLEANUP_NODE" --base "$base"
  assert_success
  removed=$(sed -n 's/^nodeA: removed \(.*\) (.*)$/\1/p' <<<"$output")
  assert_equal "$would" "$removed"
  assert_equal "$(wc -l <<<"$removed")" 5
  # What went is those folders and their content, nothing else.
  assert_equal "$(comm -13 <(tree) <(printf '%s\n' "$before"))" "base/local ssd/alice/200
base/local ssd/alice/200/nodeA
base/local ssd/alice/200/nodeA/my data
base/local ssd/alice/200/nodeA/my data/f.txt
base/local ssd/alice/301_1
base/local ssd/alice/301_1/nodeA
base/local ssd/alice/301_1/nodeA/f.txt
base/local ssd/alice/800/nodeA"
}

@test "cleanup_node.sh takes the node from --node, else SLURMD_NODENAME" {
  run "$CLEANUP_NODE" --base "$base" --node=nodeB
  assert_success
  assert_not_exist "$me/600"
  assert_dir_exist "$me/200/nodeA"
  assert_line "nodeB: removed $me/600/nodeB (job 600 is not in squeue)"
  assert_line "nodeB: kept $me/200 (job 200 is not in squeue, but the folder holds nodeA)"
}

@test "cleanup_node.sh removes nothing when squeue fails or prints something unexpected" {
  local before
  before=$(tree)
  FAKE_SQUEUE_EXIT=1 run --separate-stderr "$CLEANUP_NODE" --base "$base"
  assert_failure 1
  assert_equal "$stderr" "squeue: error: fake failure
cleanup_node.sh: error: squeue -u alice failed; removing nothing"
  assert_equal "$(tree)" "$before"
  printf 'JOBID\n100\n' >"$FAKE_SQUEUE_IDS"
  run --separate-stderr "$CLEANUP_NODE" --base "$base"
  assert_failure 1
  assert_equal "$stderr" "cleanup_node.sh: error: unexpected line in squeue output: 'JOBID'; removing nothing"
  assert_equal "$(tree)" "$before"
}

@test "cleanup_node.sh refuses an empty, missing, relative or root base with one line, exit 2" {
  local before
  before=$(tree)
  run --separate-stderr "$CLEANUP_NODE" --base ''
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: --base expects a folder, got '' (refusing an empty base)"
  run --separate-stderr "$CLEANUP_NODE" --base
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: --base expects a value"
  run --separate-stderr "$CLEANUP_NODE" --base=
  assert_failure 2
  assert_equal "${#stderr_lines[@]}" 1
  run --separate-stderr "$CLEANUP_NODE" --base relative/dir
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: --base expects an absolute path, got 'relative/dir'"
  run --separate-stderr "$CLEANUP_NODE" --base ///
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: --base must not be the root folder '/'"
  run --separate-stderr "$CLEANUP_NODE" --base "$base/../base/local ssd"
  assert_failure 2
  assert_regex "$stderr" "^cleanup_node.sh: error: --base must not contain '.' or '..' components"
  run --separate-stderr "$CLEANUP_NODE" --base "$base" --node ../x
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: --node expects a node name (letters, digits, '.', '_', '-'), got '../x'"
  assert_equal "$(tree)" "$before"
  [[ ! -s "$FAKE_SQUEUE_LOG" ]] || fail "squeue ran before the options were checked"
}

@test "cleanup_node.sh: unknown option or argument exits 2 with one line" {
  run --separate-stderr "$CLEANUP_NODE" --bogus
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: unknown option '--bogus' (see --help)"
  assert_output ""
  run --separate-stderr "$CLEANUP_NODE" --base "$base" extra
  assert_failure 2
  assert_equal "$stderr" "cleanup_node.sh: error: unexpected argument 'extra' (this command takes options only)"
}

@test "cleanup_node.sh refuses a user folder that is a symlink, and says so when there is none" {
  local real="$BATS_TEST_TMPDIR/real user"
  mkdir -p "$real/200/nodeA"
  mkdir -p "$BATS_TEST_TMPDIR/b2"
  ln -s "$real" "$BATS_TEST_TMPDIR/b2/alice"
  run --separate-stderr "$CLEANUP_NODE" --base "$BATS_TEST_TMPDIR/b2"
  assert_failure 1
  assert_equal "$stderr" "cleanup_node.sh: error: $BATS_TEST_TMPDIR/b2/alice is a symlink; refusing to clean through it"
  assert_dir_exist "$real/200/nodeA"
  USER=bob run "$CLEANUP_NODE" --base "$base"
  assert_success
  assert_output "nodeA: nothing to clean: $base/bob does not exist"
}

@test "cleanup_node.sh without USER cleans the folder of 'id -un'" {
  local me2
  me2="$base/$(id -un)"
  mkdir -p "$me2/200/nodeA"
  run env -u USER "$CLEANUP_NODE" --base "$base"
  assert_success
  assert_not_exist "$me2/200"
  assert_dir_exist "$me/200/nodeA"
}

@test "cleanup_node.sh reads the base from a site profile, expanding \$USER" {
  local site="$BATS_TEST_TMPDIR/my site.conf"
  # shellcheck disable=SC2016 # the profile holds the literal text $USER
  printf 'tmpdir_base = %s/$USER/..x\n' "$BATS_TEST_TMPDIR/site base" >"$site"
  mkdir -p "$BATS_TEST_TMPDIR/site base/alice/..x/alice/200/nodeA"
  run "$CLEANUP_NODE" --site "$site" --dry-run
  assert_success
  assert_line "nodeA: would remove $BATS_TEST_TMPDIR/site base/alice/..x/alice/200/nodeA (job 200 is not in squeue)"
  run "$CLEANUP_NODE" --site "$BATS_TEST_TMPDIR/no such.conf"
  assert_failure 2
}

@test "cleanup_node.sh --help names every option of its parser" {
  local option help
  run "$CLEANUP_NODE" --help
  assert_success
  help=$output
  for option in $(sed -n '/^parse_options()/,/^}/p' "$CLEANUP_NODE" | grep -oE '^ +-[^)]*\)' | grep -oE -- '--?[a-z][a-z-]*' | sort -u); do
    [[ "$help" == *"$option"* ]] || fail "--help does not mention $option"
  done
}

@test "submit_plai_cleanup --print renders one sbatch per node and submits nothing" {
  export FAKE_SINFO_OUT=$'node1 idle\nnode2 mixed\nnode3 drained\n'
  unset SCRATCH
  cd "$BATS_TEST_TMPDIR"
  run --separate-stderr "$SUBMIT_CLEANUP" -p notmpdir --base "$base" --print --dry-run
  assert_success
  assert_equal "$stderr" "submit_plai_cleanup: warning: skipping node node3 (state drained): a job there would wait until it is back"
  assert_equal "$(cat "$FAKE_SINFO_LOG")" "-h -N -p notmpdir -o %N %T"
  assert_equal "$output" "sbatch --parsable --partition=notmpdir --nodelist=node1 --nodes=1 --ntasks=1 --cpus-per-task=1 --time=00:05:00 --job-name=plai_cleanup --output=$BATS_TEST_TMPDIR/plai_cleanup_node1_%j.out <<'EOF'
#!/usr/bin/env bash
# plai_cleanup on node1: remove leftover local folders of finished jobs.
exec $REPO_ROOT/plai_cleanups/cleanup_node.sh --base '$base' --node node1 --dry-run
EOF
sbatch --parsable --partition=notmpdir --nodelist=node2 --nodes=1 --ntasks=1 --cpus-per-task=1 --time=00:05:00 --job-name=plai_cleanup --output=$BATS_TEST_TMPDIR/plai_cleanup_node2_%j.out <<'EOF'
#!/usr/bin/env bash
# plai_cleanup on node2: remove leftover local folders of finished jobs.
exec $REPO_ROOT/plai_cleanups/cleanup_node.sh --base '$base' --node node2 --dry-run
EOF"
}

@test "submit_plai_cleanup logs to \$SCRATCH/plai_cleanup_logs and, with no partition, covers every node once" {
  make_scratch
  export FAKE_SINFO_OUT=$'node1 idle notmpdir\nnode1 idle tmpdir*\nnode2 idle notmpdir\nnode2 idle tmpdir*\nnode9 idle gpu\n'
  run --separate-stderr "$SUBMIT_CLEANUP" --site "$REPO_ROOT/hpc_files/sites/plai.conf" --print
  assert_success
  assert_equal "$(cat "$FAKE_SINFO_LOG")" "-h -N -o %N %T %P"
  assert_equal "$(grep -c '^sbatch ' <<<"$output")" 3
  assert_line --partial "--partition=tmpdir --nodelist=node1 "
  assert_line --partial "--partition=tmpdir --nodelist=node2 "
  assert_line --partial "--partition=gpu --nodelist=node9 "
  assert_line --partial "'--output=$SCRATCH/plai_cleanup_logs/plai_cleanup_node1_%j.out'"
  assert_line "exec $REPO_ROOT/plai_cleanups/cleanup_node.sh --base /scratch-ssd --node node1"
}

@test "submit_plai_cleanup: usage errors exit 2 with one line, before sinfo" {
  run --separate-stderr "$SUBMIT_CLEANUP" --frobnicate
  assert_failure 2
  assert_equal "$stderr" "submit_plai_cleanup: error: unknown option '--frobnicate' (see --help)"
  run --separate-stderr "$SUBMIT_CLEANUP" -p
  assert_failure 2
  assert_equal "$stderr" "submit_plai_cleanup: error: -p expects a value"
  run --separate-stderr "$SUBMIT_CLEANUP" -p 'a b'
  assert_failure 2
  assert_equal "${#stderr_lines[@]}" 1
  run --separate-stderr "$SUBMIT_CLEANUP" --base ''
  assert_failure 2
  assert_equal "$stderr" "submit_plai_cleanup: error: --base expects a folder, got '' (refusing an empty base)"
  export FAKE_SINFO_OUT=""
  run --separate-stderr "$SUBMIT_CLEANUP" -p nosuch --base "$base"
  assert_failure 2
  assert_equal "$stderr" "submit_plai_cleanup: error: -p/--partition: partition 'nosuch' has no nodes (sinfo -h -N -p nosuch -o %N printed nothing)"
}

@test "submit_plai_cleanup --help names every option of its parser, and where logs go" {
  local option help
  run "$SUBMIT_CLEANUP" -h
  assert_success
  help=$output
  for option in $(sed -n '/^parse_options()/,/^}/p' "$SUBMIT_CLEANUP" | grep -oE '^ +-[^)]*\)' | grep -oE -- '--?[a-z][a-z-]*' | sort -u); do
    [[ "$help" == *"$option"* ]] || fail "--help does not mention $option"
  done
  assert_output --partial "\$SCRATCH/plai_cleanup_logs/ if SCRATCH is"
  assert_output --partial "set, else in the current folder"
}

@test "the cleanup reads site profiles with read_site_file, touching no option of the submitter" {
  local site="$BATS_TEST_TMPDIR/p.conf"
  # shellcheck disable=SC2016 # the profile holds the literal text $USER
  printf 'partition = cpu\ntmpdir_base = /t/$USER\n' >"$site"
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1/hpc_files
    source "$HPC_FILES_DIR/lib/common.sh"
    source "$HPC_FILES_DIR/lib/site.sh"
    source "$1/plai_cleanups/lib.sh"
    check_base() { printf "%s\n" "$1"; }
    cleanup_site_partition "$2"
    printf "\n"
    cleanup_base 0 "" "$2"
    declare -p | grep -E "^declare -[-aA]+ (opt_|OPT_GIVEN|DEFAULT_SITE)" || true' _ "$REPO_ROOT" "$site"
  assert_success
  assert_equal "$output" "cpu
/t/alice"
}

@test "submit_plai_cleanup --wait ends on a job held after a requeue (REQUEUE_HOLD), says its state, exits 1" {
  export FAKE_SINFO_OUT=$'node1 idle\nnode2 idle\n'
  unset SCRATCH
  cd "$BATS_TEST_TMPDIR"
  printf '#!/bin/sh\ncat >/dev/null\necho "55;cluster"\n' >"$bin/sbatch"
  # Every job id: the first record scontrol prints for it.
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
[[ "$1 $2 $3" == "show job -o" ]] || exit 1
printf 'JobId=%s JobName=plai_cleanup JobState=REQUEUE_HOLD Reason=JobHeldAdmin Requeue=1 Restarts=1\n' "$4"
STUB
  chmod +x "$bin/sbatch" "$bin/scontrol"
  run --separate-stderr timeout 20 "$SUBMIT_CLEANUP" -p part --base "$base" --wait
  assert_failure 1
  assert_line "submit_plai_cleanup: job 55 on node1: REQUEUE_HOLD"
  assert_line "submit_plai_cleanup: job 55 on node2: REQUEUE_HOLD"
}
