#!/usr/bin/env bats
# hpc_files/lib/submit.sh: the log path it reports, the job states --wait
# reads (scontrol stubbed), and when --wait stops.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
HPC_PROG=job_submitter.sh
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/submit.sh
source "$HPC_FILES_DIR/lib/submit.sh"

# stub_scontrol LINE...: 'scontrol show job -o' prints these lines.
stub_scontrol() {
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  printf '%s\n' "$@" >"$BATS_TEST_TMPDIR/scontrol.out"
  printf '#!/usr/bin/env bash\ncat "%s"\n' "$BATS_TEST_TMPDIR/scontrol.out" >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  PATH="$bin:$PATH"
}

@test "log_path: a project name with '&' stays as it is (bash 5.2 reads & in a replacement)" {
  plan_log_dir='/s/a&b/hpc_outputs'
  plan_job_name='a&b_exp'
  plan_log_name=%x_%j.out
  run log_path 17
  assert_output '/s/a&b/hpc_outputs/a&b_exp_17.out'
  plan_log_name=%x_%A_%a.out
  run log_path 17
  assert_output '/s/a&b/hpc_outputs/a&b_exp_17_<task>.out'
}

@test "job_states: state and exit code of every array task" {
  stub_scontrol 'JobId=5 ArrayJobId=5 ArrayTaskId=0 JobState=COMPLETED Reason=None ExitCode=0:0 RunTime=1' \
    'JobId=6 ArrayJobId=5 ArrayTaskId=1 JobState=FAILED Reason=NonZeroExitCode ExitCode=7:0 RunTime=1' \
    'JobId=7 ArrayJobId=5 ArrayTaskId=2 JobState=REQUEUE_HOLD Reason=JobHeldAdmin ExitCode=0:15 RunTime=1' \
    'JobId=8 ArrayJobId=5 ArrayTaskId=3 OrigJobState=RUNNING JobState=PENDING Reason=None RunTime=0' \
    'JobId=9 ArrayJobId=5 ArrayTaskId=4 JobState=RUNNING ExitCode=N/A ExitCode=3:0 RunTime=1' \
    'JobId=10 ArrayJobId=5 ArrayTaskId=5 OrigJobState=RUNNING Reason=None'
  run job_states 5
  assert_output 'COMPLETED 0:0
FAILED 7:0
REQUEUE_HOLD 0:15
PENDING 0:0
RUNNING 0:0'
}

@test "wait_for_job ends on a job held after a requeue, says how to release it, exits non-zero" {
  stub_scontrol 'JobId=9 JobName=x JobState=REQUEUE_HOLD Reason=JobHeldAdmin ExitCode=0:0 RunTime=1'
  job_id=9
  plan_array_spec=""
  plan_log_dir=$BATS_TEST_TMPDIR
  plan_log_name=%x_%j.out
  plan_job_name=x
  run --separate-stderr timeout 10 bash -c "$(declare -f wait_for_job job_states job_records record_field is_final_state log_path info warn die error_line one_line); HPC_PROG=job_submitter.sh; $(declare -p job_id plan_array_spec plan_log_dir plan_log_name plan_job_name); wait_for_job"
  assert_failure 1
  [[ "$stderr" == *"job 9 is held after a requeue; it runs again only after: scontrol release 9"* ]] || fail "stderr: $stderr"
}

@test "check_wandb_credentials: a key file others can read is refused (exit 2, says chmod 600); a private or missing one passes" {
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  run check_wandb_credentials
  assert_success
  printf 'k\n' >"$HOME/wandb_credentials.txt"
  chmod 644 "$HOME/wandb_credentials.txt"
  run --separate-stderr check_wandb_credentials
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $HOME/wandb_credentials.txt is readable by others (mode 644); run: chmod 600 '$HOME/wandb_credentials.txt'"
  chmod 600 "$HOME/wandb_credentials.txt"
  run --separate-stderr check_wandb_credentials
  assert_success
  assert_equal "$stderr" ""
}

@test "check_wandb_credentials: a private file the node would find no key in is said at submission (a warning)" {
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  (umask 077 && printf 'WANDB_ENTITY=me\nWANDB_PROJECT=p\n' >"$HOME/wandb_credentials.txt")
  run --separate-stderr check_wandb_credentials
  assert_success
  assert_equal "$stderr" "job_submitter.sh: warning: $HOME/wandb_credentials.txt holds no W&B key (the key alone on one line, or a line WANDB_API_KEY=<key>); the jobs get none from it"
  (umask 077 && printf 'WANDB_ENTITY=me\nWANDB_API_KEY=k\n' >"$HOME/wandb_credentials.txt")
  run --separate-stderr check_wandb_credentials
  assert_success
  assert_equal "$stderr" ""
}

@test "check_wandb_credentials: a link to the key file is judged by the file's mode (stat -L), not the link's 777" {
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME" "$BATS_TEST_TMPDIR/keys"
  (umask 077 && printf 'WANDB_API_KEY=k\n' >"$BATS_TEST_TMPDIR/keys/wandb.txt")
  ln -s "$BATS_TEST_TMPDIR/keys/wandb.txt" "$HOME/wandb_credentials.txt"
  run --separate-stderr check_wandb_credentials
  assert_success
  assert_equal "$stderr" ""
  chmod 644 "$BATS_TEST_TMPDIR/keys/wandb.txt"
  run --separate-stderr check_wandb_credentials
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $HOME/wandb_credentials.txt is readable by others (mode 644); run: chmod 600 '$HOME/wandb_credentials.txt'"
}

@test "make_submission_dir: a new private folder <stamp>-XXXX under the experiment, and the log and checkpoint folders" {
  plan_exp_dir="$BATS_TEST_TMPDIR/scratch space/proj/exp"
  plan_log_dir="$BATS_TEST_TMPDIR/scratch space/proj/hpc_outputs"
  make_submission_dir
  assert_regex "$submission_dir" "^$plan_exp_dir/[0-9]{8}-[0-9]{6}-[A-Za-z0-9]{4}$"
  assert_equal "$(stat -c %a "$submission_dir")" 700
  assert_dir_exists "$plan_log_dir"
  assert_dir_exists "$plan_exp_dir/checkpoints"
  local first=$submission_dir
  make_submission_dir
  [[ "$submission_dir" != "$first" ]] || fail "the same folder twice"
}

@test "remove_unsubmitted_dir: removes the folder of a job sbatch never accepted, keeps a submitted or --no-submit one" {
  submission_dir="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$submission_dir"
  job_id=4242
  remove_unsubmitted_dir
  assert_dir_exists "$submission_dir"
  job_id=""
  submission_complete=1
  remove_unsubmitted_dir
  assert_dir_exists "$submission_dir"
  submission_complete=""
  remove_unsubmitted_dir
  assert_not_exist "$submission_dir"
}

@test "record_git_state: the commit, the status and the diff of a git project; 'not a git repository' outside one" {
  source_dir="$BATS_TEST_TMPDIR/project"
  mkdir -p "$source_dir"
  record_git_state "$BATS_TEST_TMPDIR/git.txt"
  assert_equal "$(head -n 1 "$BATS_TEST_TMPDIR/git.txt")" "commit: not a git repository"
  git -C "$source_dir" init -q
  printf 'one\n' >"$source_dir/train.py"
  git -C "$source_dir" add train.py
  git -C "$source_dir" -c user.name=t -c user.email=t@t commit -qm one
  printf 'two\n' >"$source_dir/train.py"
  record_git_state "$BATS_TEST_TMPDIR/git.txt"
  run cat "$BATS_TEST_TMPDIR/git.txt"
  assert_line "commit: $(git -C "$source_dir" rev-parse HEAD)"
  assert_line "source: $source_dir"
  assert_line " M train.py"
  assert_line "+two"
  # Clean: an empty status and no diff.
  git -C "$source_dir" checkout -q train.py
  record_git_state "$BATS_TEST_TMPDIR/git.txt"
  assert_equal "$(cat "$BATS_TEST_TMPDIR/git.txt")" "commit: $(git -C "$source_dir" rev-parse HEAD)
source: $source_dir
status:
diff:"
}

@test "snapshot_code: git's files (tracked and not ignored) into one archive; over the cap: exit 2" {
  source_dir="$BATS_TEST_TMPDIR/project"
  mkdir -p "$source_dir/results"
  git -C "$source_dir" init -q
  printf 'results/\n' >"$source_dir/.gitignore"
  printf 'print(1)\n' >"$source_dir/train.py"
  printf 'big\n' >"$source_dir/results/out.bin"
  snapshot_code "$BATS_TEST_TMPDIR/code.tar"
  assert_equal "$(tar -tf "$BATS_TEST_TMPDIR/code.tar" | LC_ALL=C sort | tr '\n' ' ')" ".gitignore train.py "
  head -c 2097152 /dev/zero >"$source_dir/weights.bin"
  HPC_SNAPSHOT_MAX_MB=1 run --separate-stderr snapshot_code "$BATS_TEST_TMPDIR/code2.tar"
  assert_failure 2
  assert_regex "$stderr" "over the 1 MiB cap \(HPC_SNAPSHOT_MAX_MB\)"
}

@test "report_unsubmitted: says nothing was queued; the last line submits the folder from anywhere" {
  submission_dir="$BATS_TEST_TMPDIR/sub mission"
  plan_trial_count=3 plan_nodes=2 plan_gpus_per_node=4 plan_kind=torchrun
  run report_unsubmitted
  assert_line --index 0 "Wrote $submission_dir (3 trial(s), 2 node(s) x 4 GPU(s), -W torchrun); nothing was queued."
  assert_equal "${lines[-1]}" "sbatch '$submission_dir/job.sbatch'"
}

@test "submit_job: sbatch from the submission folder with the requeue contract on its command line; the job id from its output" {
  stub_sbatch
  submission_dir="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$submission_dir"
  plan_requeue_args=(--requeue --signal=B:USR1@90)
  plan_time=01:00:00 plan_dependency="" setup_job_id=""
  submit_job
  assert_equal "$job_id" 4242
  assert_equal "$(cat "$submission_dir/job_id")" 4242
  assert_equal "$(tr '\n' ' ' <"$STUB_SBATCH_LOG")" "--parsable --requeue --signal=B:USR1@90 --time=01:00:00 --export=ALL job.sbatch -- "
  assert_equal "$(tr '\n' ' ' <"$STUB_SBATCH_LOG.env")" "HPC_CONTRACT_ON_COMMAND_LINE=1 -- "
}

@test "wait_for_job: exits with the largest exit code over the tasks (a signal as 128+N)" {
  stub_scontrol 'JobId=5 ArrayTaskId=0 JobState=COMPLETED ExitCode=0:0' \
    'JobId=6 ArrayTaskId=1 JobState=FAILED ExitCode=3:0' \
    'JobId=7 ArrayTaskId=2 JobState=CANCELLED ExitCode=0:9'
  job_id=5 plan_array_spec=0-2 plan_log_dir=$BATS_TEST_TMPDIR plan_log_name=%x_%A_%a.out plan_job_name=x
  run --separate-stderr timeout 10 bash -c "$(declare -f wait_for_job job_states job_records record_field is_final_state log_path info warn die error_line one_line); HPC_PROG=job_submitter.sh; $(declare -p job_id plan_array_spec plan_log_dir plan_log_name plan_job_name); wait_for_job"
  assert_failure 137
  assert_regex "$stderr" "job 5: CANCELLED x1, COMPLETED x1, FAILED x1"
}

@test "prepare_trials: a command after '--' and a configs file are expanded in a temporary folder" {
  # shellcheck source=../../../hpc_files/lib/trials.sh
  source "$HPC_FILES_DIR/lib/trials.sh"
  HPC_PYTHON="$REPO_ROOT/.venv/bin/python"
  [[ -x "$HPC_PYTHON" ]] || HPC_PYTHON=python3
  source_dir=$REPO_ROOT
  TMPDIR="$BATS_TEST_TMPDIR/tmp"
  mkdir -p "$TMPDIR"
  opt_seeds="" opt_sweep="" opt_wandb_sweep="" opt_configs=""
  HPC_CLEANUP_PATHS=()
  opt_command=(python train.py --lr 0.1)
  trials_dir=""
  prepare_trials
  finish_trials
  assert_equal "$trials_count" 1
  assert_equal "$(cat "$trials_dir/commands.txt")" "python train.py --lr 0.1"
  assert_file_exists "$trials_dir/trials.jsonl"
  opt_command=()
  opt_configs="$BATS_TEST_TMPDIR/configs.txt"
  printf 'python train.py --lr 0.1\npython train.py --lr 0.2\n' >"$opt_configs"
  prepare_trials
  finish_trials
  assert_equal "$trials_count" 2
  assert_equal "$(wc -l <"$trials_dir/commands.txt")" 2
  run_cleanup
}
