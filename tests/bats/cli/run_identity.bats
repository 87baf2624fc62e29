#!/usr/bin/env bats
# Whether a submission is whole and belongs to one run, with a stubbed sbatch:
# --no-submit writes a folder whose job.sbatch names itself; the code snapshot
# holds the project as it was; --dry-run refuses what a submission refuses;
# the environment cannot change the requeue contract; a resubmission warns
# when the experiment's checkpoints came from other commands, other code or
# another checkout. No cluster.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  stub_sbatch_recording
}

# make_project DIR [git]: a project with the toolkit and a program prog.sh;
# with 'git', a repository with one commit.
make_project() {
  local dir=$1
  mkdir -p "$dir"
  cp -r "$REPO_ROOT/hpc_files" "$REPO_ROOT/virtual_env_hpc_files" "$REPO_ROOT/singularity_hpc_files" "$dir/"
  printf 'echo "code version 1"\n' >"$dir/prog.sh"
  [[ "${2:-}" == git ]] || return 0
  printf 'ignored.txt\n' >"$dir/.gitignore"
  git -C "$dir" init -q
  git -C "$dir" add -A
  git -C "$dir" -c user.name=t -c user.email=t@t commit -q -m one
}

# unpacked_snapshot: the submission's code.tar unpacked as the job does (sets code).
unpacked_snapshot() {
  code="$BATS_TEST_TMPDIR/unpacked"
  rm -rf "$code"
  mkdir -p "$code"
  tar -xf "$sub/code.tar" -C "$code"
}

# submit_ok ARG...: job_submitter.sh ARG... succeeds; sets output/stderr.
submit_ok() {
  run --separate-stderr timeout 60 "$SUBMITTER" "$@" </dev/null
  ((status == 0)) || fail "job_submitter.sh $* exited $status: $stderr"
}

# submit_prog PROJECT EXP: PROJECT's submitter runs 'bash prog.sh' as EXP
# and succeeds; sets output/stderr.
submit_prog() {
  run --separate-stderr "$1/hpc_files/job_submitter.sh" -e "$2" -g 0 -W none -- bash prog.sh </dev/null
  assert_success
}

# one_submission PROJECT EXP: the one submission folder (sets sub).
one_submission() {
  sub=$(find "$SCRATCH/${1##*/}/$2" -mindepth 1 -maxdepth 1 -type d ! -name checkpoints ! -name trials)
  [[ -n "$sub" && "$sub" != *$'\n'* ]] || fail "expected one submission folder, found: '$sub'"
}

@test "--dry-run refuses a configs file a submission refuses (exit 2): an unbalanced quote, only comments" {
  printf 'python a.py "unbalanced\n' >"$BATS_TEST_TMPDIR/quote.txt"
  refuse 'unbalanced " quote' -- --dry-run -C "$BATS_TEST_TMPDIR/quote.txt"
  printf '# only a comment\n\n' >"$BATS_TEST_TMPDIR/comments.txt"
  refuse 'no experiments' -- --dry-run -C "$BATS_TEST_TMPDIR/comments.txt"
}

@test "--dry-run says in its first comment that it is a preview, and writes nothing" {
  run --separate-stderr "$SUBMITTER" --dry-run -e preview -C "$ONE_LINE" </dev/null
  assert_success
  assert_line --index 1 '# Preview (--dry-run): nothing was written or submitted, and the submission'
  assert_equal "$(find "$SCRATCH" -mindepth 1 | wc -l)" 0
  assert_file_not_exists "$STUB_SBATCH_LOG"
}

@test "--no-submit writes the whole folder, queues nothing, and prints the sbatch line last" {
  local project="$BATS_TEST_TMPDIR/my project"
  make_project "$project" git
  run --separate-stderr "$project/hpc_files/job_submitter.sh" -e later -g 0 -W none --no-submit -- bash prog.sh </dev/null
  assert_success
  one_submission "$project" later
  assert_equal "${lines[-1]}" "sbatch '$sub/job.sbatch'"
  assert_file_not_exists "$STUB_SBATCH_LOG"
  local f
  for f in job.sbatch commands.txt trials.jsonl command.txt git.txt node/batch.sh node/launch.sh code.tar; do
    assert_file_exists "$sub/$f"
  done
  # A command after '--' (no --seeds): trials.py writes its manifest too.
  assert_equal "$(cat "$sub/commands.txt")" "bash prog.sh"
  assert_equal "$(cat "$sub/trials.jsonl")" '{"argv":["bash","prog.sh"],"params":{},"source":"configs:1","trial":0}'
  assert_file_not_exists "$sub/job_id"
  # The script needs nothing from the submitting shell to find its folder.
  grep -qxF "export HPC_SUBMISSION_DIR='$sub'" "$sub/job.sbatch"
  grep -qxF "export source_dir='$sub/code'" "$sub/job.sbatch"
  ! grep -q 'HPC_SUBMISSION_DIR:?' "$sub/job.sbatch" || fail "job.sbatch still needs HPC_SUBMISSION_DIR from the environment"
}

@test "--no-submit with --dry-run, --wait or --setup-venv is refused" {
  refuse '--no-submit writes the submission folder and --dry-run writes nothing' -- --no-submit --dry-run -C "$ONE_LINE"
  refuse '--wait follows a queued job' -- --no-submit --wait -C "$ONE_LINE"
  printf 'numpy\n' >"$BATS_TEST_TMPDIR/req.txt"
  refuse '--setup-venv submits a setup job' -- --no-submit --setup-venv "$BATS_TEST_TMPDIR/req.txt" -C "$ONE_LINE"
}

@test "git project: the snapshot holds tracked files as edited and untracked ones, not ignored or deleted ones" {
  local project="$BATS_TEST_TMPDIR/gitproj"
  make_project "$project" git
  printf 'echo "code version 2"\n' >"$project/prog.sh"
  printf 'new\n' >"$project/untracked.txt"
  printf 'secret data\n' >"$project/ignored.txt"
  rm "$project/hpc_files/sites/cedar.conf"
  submit_prog "$project" snap
  one_submission "$project" snap
  unpacked_snapshot
  assert_file_contains "$code/prog.sh" 'code version 2'
  assert_file_exists "$code/untracked.txt"
  assert_file_not_exists "$code/ignored.txt"
  assert_file_not_exists "$code/hpc_files/sites/cedar.conf"
  assert_file_exists "$code/hpc_files/sites/local.conf"
  # git.txt: the commit, and the edits the snapshot holds on top of it.
  assert_file_contains "$sub/git.txt" "^commit: $(git -C "$project" rev-parse HEAD)$"
  assert_file_contains "$sub/git.txt" '^+echo "code version 2"$'
  assert_file_contains "$sub/git.txt" '^?? untracked.txt$'
  # Editing the project afterwards changes nothing in the snapshot.
  printf 'echo "code version 3"\n' >"$project/prog.sh"
  unpacked_snapshot
  assert_file_contains "$code/prog.sh" 'code version 2'
}

@test "a project outside git: the snapshot leaves out the venv, data, caches and results" {
  local project="$BATS_TEST_TMPDIR/plain"
  make_project "$project"
  mkdir -p "$project/.venv/bin" "$project/data" "$project/pkg/__pycache__" "$project/wandb" "$project/pkg"
  touch "$project/.venv/bin/python" "$project/data/big.bin" "$project/pkg/__pycache__/m.pyc" "$project/wandb/run.log"
  printf 'x = 1\n' >"$project/pkg/m.py"
  run --separate-stderr env GIT_CEILING_DIRECTORIES="$BATS_TEST_TMPDIR" \
    "$project/hpc_files/job_submitter.sh" -e plain -g 0 -W none -- bash prog.sh </dev/null
  assert_success
  one_submission "$project" plain
  unpacked_snapshot
  assert_file_exists "$code/prog.sh"
  assert_file_exists "$code/pkg/m.py"
  assert_file_exists "$code/hpc_files/job_submitter.sh"
  local gone
  for gone in .venv data pkg/__pycache__ wandb; do
    assert_file_not_exists "$code/$gone"
  done
}

@test "a snapshot over HPC_SNAPSHOT_MAX_MB is refused with exit 2 and one line; nothing is submitted or kept" {
  local project="$BATS_TEST_TMPDIR/big"
  make_project "$project" git
  head -c 2097152 /dev/zero >"$project/weights.bin"
  run --separate-stderr env HPC_SNAPSHOT_MAX_MB=1 "$project/hpc_files/job_submitter.sh" -e big -g 0 -W none -- bash prog.sh </dev/null
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: the project's code snapshot is over the 1 MiB cap (HPC_SNAPSHOT_MAX_MB); move data and results under \$SCRATCH, git-ignore them, or run the live tree with --no-snapshot"
  assert_file_not_exists "$STUB_SBATCH_LOG"
  assert_equal "$(find "$SCRATCH/big/big" -mindepth 1 -maxdepth 1 ! -name checkpoints)" ""
  # --no-snapshot runs the live tree instead.
  run --separate-stderr env HPC_SNAPSHOT_MAX_MB=1 "$project/hpc_files/job_submitter.sh" -e big -g 0 -W none --no-snapshot -- bash prog.sh </dev/null
  assert_success
  one_submission "$project" big
  grep -qxE "export source_dir='?$project'?" "$sub/job.sbatch"
  assert_file_not_exists "$sub/code.tar"
}

@test "SBATCH_* variables and WANDB_API_KEY of the submitting shell reach neither the contract nor the job" {
  local key
  key="wandb-fake-key-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  SBATCH_NO_REQUEUE=1 SBATCH_SIGNAL=B:USR2@5 SBATCH_OPEN_MODE=truncate SBATCH_TIMELIMIT=1 WANDB_API_KEY=$key \
    run --separate-stderr "$SUBMITTER" -e contract -C "$ONE_LINE" -t 30 --signal-lead 20 </dev/null
  assert_success
  # On sbatch's command line, these beat the SBATCH_* variables.
  grep -qx -- '--requeue' "$STUB_SBATCH_LOG"
  grep -qx -- '--signal=B:USR1@20' "$STUB_SBATCH_LOG"
  grep -qx -- '--open-mode=append' "$STUB_SBATCH_LOG"
  grep -qx -- '--time=30' "$STUB_SBATCH_LOG"
  grep -qx -- '--export=ALL' "$STUB_SBATCH_LOG"
  grep -qx -- 'HPC_CONTRACT_ON_COMMAND_LINE=1' "$STUB_SBATCH_LOG.env"
  ! grep -qF -- "$key" "$STUB_SBATCH_LOG.env" || fail "WANDB_API_KEY reached sbatch's environment (and so the job's)"
}

@test "resubmitting an experiment whose checkpoints came from other commands warns; the same commands do not" {
  submit_ok -e warm -- python -m hpc_harness.train --lr 0.1
  mkdir -p "$SCRATCH/$PROJECT/warm/checkpoints"
  touch "$SCRATCH/$PROJECT/warm/checkpoints/ckpt_step00000010.pt"
  submit_ok -e warm -- python -m hpc_harness.train --lr 0.1
  assert_equal "$stderr" ""
  local last
  last=$(sed -n 's/^  submission: //p' <<<"$output")
  submit_ok -e warm -- python -m hpc_harness.train --lr 0.001
  assert_equal "$stderr" "job_submitter.sh: warning: experiment 'warm' already holds checkpoints, and its last submission ($last) ran other commands; the harness refuses to resume a checkpoint of other arguments (but for those a resume may change, such as --max-steps: README, Resuming), or one already past --max-steps: use -e NEW_NAME, or add --fresh to start over (the old checkpoints are kept aside)"
}

@test "a sharded checkpoint folder (ckpt_step*.dcp) counts as checkpoints for that warning" {
  submit_ok -e sharded -- python -m hpc_harness.train --lr 0.1
  mkdir -p "$SCRATCH/$PROJECT/sharded/checkpoints/ckpt_step00000010.dcp"
  touch "$SCRATCH/$PROJECT/sharded/checkpoints/ckpt_step00000010.dcp/meta.pt"
  local last
  last=$(sed -n 's/^  submission: //p' <<<"$output")
  submit_ok -e sharded -- python -m hpc_harness.train --lr 0.001
  assert_equal "$stderr" "job_submitter.sh: warning: experiment 'sharded' already holds checkpoints, and its last submission ($last) ran other commands; the harness refuses to resume a checkpoint of other arguments (but for those a resume may change, such as --max-steps: README, Resuming), or one already past --max-steps: use -e NEW_NAME, or add --fresh to start over (the old checkpoints are kept aside)"
}

# checkpointed PROJECT EXP: a checkpoint in EXP's folder, as a run leaves it.
checkpointed() {
  mkdir -p "$SCRATCH/${1##*/}/$2/checkpoints"
  touch "$SCRATCH/${1##*/}/$2/checkpoints/ckpt_step00000010.pt"
}

@test "resubmitting the same commands with other code warns that the runs resume the checkpoints with it; the same code does not" {
  local project="$BATS_TEST_TMPDIR/gitproj" last head
  make_project "$project" git
  submit_prog "$project" code
  checkpointed "$project" code
  # Untracked results beside the code are not the code: no warning.
  printf 'out\n' >"$project/results.txt"
  submit_prog "$project" code
  assert_equal "$stderr" ""
  last=$(sed -n 's/^  submission: //p' <<<"$output")
  # An uncommitted edit.
  printf 'echo "code version 2"\n' >"$project/prog.sh"
  submit_prog "$project" code
  head=$(git -C "$project" rev-parse --short=12 HEAD)
  assert_equal "$stderr" "job_submitter.sh: warning: experiment 'code' already holds checkpoints, and its last submission ($last) ran other code (commit $head, other uncommitted edits); its runs will resume those checkpoints with this code: use -e NEW_NAME, or add --fresh to start over, if that is not what you want"
  # The edit committed: another commit.
  last=$(sed -n 's/^  submission: //p' <<<"$output")
  git -C "$project" -c user.name=t -c user.email=t@t commit -qam two
  submit_prog "$project" code
  assert_equal "$stderr" "job_submitter.sh: warning: experiment 'code' already holds checkpoints, and its last submission ($last) ran other code (commit $head, this one $(git -C "$project" rev-parse --short=12 HEAD)); its runs will resume those checkpoints with this code: use -e NEW_NAME, or add --fresh to start over, if that is not what you want"
}

@test "resubmitting from another checkout with the same folder name warns: both write \$SCRATCH/<name>" {
  local first="$BATS_TEST_TMPDIR/a/proj" second="$BATS_TEST_TMPDIR/b/proj" last
  make_project "$first" git
  mkdir -p "${second%/*}"
  cp -a "$first" "$second"
  submit_prog "$first" shared
  checkpointed "$first" shared
  last=$(sed -n 's/^  submission: //p' <<<"$output")
  submit_prog "$second" shared
  assert_equal "$stderr" "job_submitter.sh: warning: experiment 'shared' already holds checkpoints, and its last submission ($last) came from another checkout ($first; this one is $second, and both write $SCRATCH/proj); its runs will resume those checkpoints with this code: use -e NEW_NAME, or add --fresh to start over, if that is not what you want"
}

@test "a project outside git: resubmitting after an edit says nothing of the code (no commit to compare)" {
  local project="$BATS_TEST_TMPDIR/plainproj"
  make_project "$project"
  submit_prog "$project" plain
  checkpointed "$project" plain
  printf 'echo "code version 2"\n' >"$project/prog.sh"
  submit_prog "$project" plain
  assert_equal "$stderr" ""
}
