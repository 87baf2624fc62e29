#!/usr/bin/env bats
# hpc_files/node/batch.sh's functions, loaded without running main, with
# scontrol stubbed.

load '../test_helper'

setup() {
  # batch.sh minus its last line ('main "$@"'), beside the lib.sh it sources.
  local node="$BATS_TEST_TMPDIR/node"
  mkdir -p "$node"
  cp "$REPO_ROOT"/hpc_files/node/*.sh "$node/"
  sed '$d' "$REPO_ROOT/hpc_files/node/batch.sh" >"$node/batch_functions.sh"
  # shellcheck source=/dev/null
  source "$node/batch_functions.sh"
  export SLURM_JOB_ID=77
  bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  PATH="$bin:$PATH"
}

# scontrol_says LINE: 'scontrol show job -o' prints LINE.
scontrol_says() {
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" %q\n' "$1" >"$bin/scontrol"
  chmod +x "$bin/scontrol"
}

@test "requeue_already_requested: a running job is not, whatever its Requeue=1 flag says" {
  scontrol_says 'JobId=77 JobName=x JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0'
  run requeue_already_requested
  assert_failure
  # Its second run, not requeued again.
  scontrol_says 'JobId=77 JobName=x JobState=COMPLETING Reason=None Requeue=1 Restarts=1'
  SLURM_RESTART_COUNT=1 run requeue_already_requested
  assert_failure
}

@test "requeue_already_requested: requeued by the program while it ran (COMPLETING, Restarts counted at once)" {
  scontrol_says 'JobId=77 JobName=x JobState=COMPLETING Reason=None Requeue=1 Restarts=1'
  SLURM_RESTART_COUNT=0 run requeue_already_requested
  assert_success
}

@test "requeue_already_requested: REQUEUED, REQUEUE_HOLD or PENDING again means someone requeued it" {
  local state
  for state in REQUEUED REQUEUE_HOLD PENDING; do
    scontrol_says "JobId=77 JobName=x JobState=$state Reason=BeginTime Requeue=1 Restarts=1"
    run requeue_already_requested
    assert_success
  done
}

@test "requeue_or_stop: scontrol requeue survives the TERM that requeueing sends to the job" {
  # This scontrol gets the TERM during 'requeue', as when SLURM requeues the
  # running job whose batch shell runs it.
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
if [[ "$1" == requeue ]]; then
  kill -TERM $$
  sleep 0.2
  echo "requeue done" >&2
  exit 0
fi
echo "JobId=77 JobState=RUNNING Reason=None Requeue=1"
STUB
  chmod +x "$bin/scontrol"
  HPC_MAX_REQUEUES=3 SLURM_RESTART_COUNT=0 signal_seen=USR1 run requeue_or_stop
  assert_success
  assert_output --partial 'requeue done'
  assert_output --partial 'hpc: requeued 77 (restart 1 of at most 3)'
}

# step_runs COMMAND: the training step is this bash command (not srun).
step_runs() {
  step_command=$1
  # shellcheck disable=SC2317 # called by run_training_step
  training_step_argv() { step_argv=(bash -c "$step_command"); }
}

# run_step: run_training_step with the batch shell's USR1 trap; prints the status.
run_step() {
  trap 'on_signal USR1' USR1
  run_training_step
  echo "step_status=$step_status"
}

@test "run_training_step: a step that exits 42 just as the wall-time signal interrupts the wait keeps its 42" {
  # The step signals this shell (so wait is interrupted) and exits at once;
  # it ignores the USR1 this shell forwards back, as a checkpointing program
  # that handles it would.
  # Like launch.sh, it records its status in the run folder first.
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$(run_dir)/exit"
  # shellcheck disable=SC2016 # expanded by the step
  step_runs 'trap "" USR1; echo "42 node1" >"$HPC_SUBMISSION_DIR/runs/77/exit/task0"; kill -USR1 $PPID; exit 42'
  run run_step
  assert_success
  assert_line 'step_status=42'
}

@test "run_training_step: a signal that came before the step had a pid is forwarded once it has one" {
  # Whether the step is ready for it is the step's affair (it may still be
  # starting, as with a signal from SLURM); this checks that it is sent.
  step_runs 'trap "exit 42" USR1; sleep 0.3; exit 0'
  signal_seen=USR1
  # shellcheck disable=SC2317 # called by run_training_step
  kill() {
    [[ "$1" != -s ]] || echo "sent SIG$2 to the step"
    builtin kill "$@"
  }
  run run_step
  assert_line 'sent SIGUSR1 to the step'
}

@test "check_job_contract: warns when SLURM shows the job may not be requeued (Requeue=0), not otherwise" {
  HPC_CONTRACT_ON_COMMAND_LINE=1
  scontrol_says 'JobId=77 JobName=x JobState=RUNNING Reason=None Requeue=0 Restarts=0 ExitCode=0:0'
  run --separate-stderr check_job_contract
  assert_success
  assert_equal "$stderr" "hpc: error: this job may not be requeued (--no-requeue or SBATCH_NO_REQUEUE at submission): at the wall time it checkpoints and ends; sbatch job.sbatch again to continue"
  scontrol_says 'JobId=77 JobName=x JobState=RUNNING Reason=None Requeue=1 Restarts=0 ExitCode=0:0'
  run --separate-stderr check_job_contract
  assert_equal "$stderr" ''
  # A job name that reads like the flag is not the flag.
  scontrol_says 'JobId=77 JobName=Requeue=0 JobState=RUNNING Requeue=1 Restarts=0'
  run --separate-stderr check_job_contract
  assert_equal "$stderr" ''
}

# task_exit TASK STATUS NODE TIME: the exit file launch.sh writes for TASK,
# dated TIME (the order tasks ended in).
task_exit() {
  local dir
  dir="$(run_dir)/exit"
  mkdir -p "$dir"
  printf '%s %s\n' "$2" "$3" >"$dir/task$1"
  touch -d "$4" "$dir/task$1"
}

@test "report_first_failure: names the task that failed first and makes its code the step's" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  task_exit 0 0 node1 '2026-01-01 10:00:00'
  task_exit 3 7 node2 '2026-01-01 10:00:01'
  task_exit 1 143 node1 '2026-01-01 10:00:02'
  task_exit 2 143 node2 '2026-01-01 10:00:03'
  step_status=143
  report_first_failure 2>"$BATS_TEST_TMPDIR/err"
  assert_equal "$step_status" 7
  assert_equal "$(cat "$BATS_TEST_TMPDIR/err")" "hpc: error: task3 on node2 exited first, with code 7"
}

@test "report_first_failure: no exit files, or none non-zero, changes nothing" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  step_status=9
  run --separate-stderr report_first_failure
  assert_success
  assert_equal "$stderr" ""
  task_exit 0 0 node1 '2026-01-01 10:00:00'
  report_first_failure
  assert_equal "$step_status" 9
}

@test "recorded_step_status: the largest status the tasks recorded; unchanged when none did" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  step_status=-1
  recorded_step_status
  assert_equal "$step_status" -1
  task_exit 0 0 node1 '2026-01-01 10:00:00'
  task_exit 1 42 node1 '2026-01-01 10:00:02'
  task_exit 2 3 node2 '2026-01-01 10:00:01'
  recorded_step_status
  assert_equal "$step_status" 42
}

@test "stop_keeper: asks through the stop file too, so a keeper srun that does not forward USR2 still ends" {
  # srun forwards a signal only to the tasks it has seen start: a stand-in
  # keeper srun that drops USR2 and ends on the stop file, with a watchdog
  # (3>&-: bats waits for whatever holds its fd 3).
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  local stage watchdog
  stage=$(stage_dir)
  mkdir -p "$stage"
  (
    trap '' USR2
    while [[ ! -e "$stage/stop" ]]; do sleep 0.1; done
  ) 3>&- &
  keeper_pid=$! keeper_stage_dir=$stage
  (sleep 20 && : >"$BATS_TEST_TMPDIR/watchdog fired" && kill "$keeper_pid") 2>/dev/null 3>&- &
  watchdog=$!
  stop_keeper
  kill "$watchdog" 2>/dev/null || true
  assert_not_exist "$BATS_TEST_TMPDIR/watchdog fired"
  assert_file_exists "$stage/stop"
  assert_equal "$keeper_pid" ""
}

@test "export_rendezvous: MASTER_ADDR is the allocation's first node even when the submitting shell had one; MASTER_PORT may be set" {
  printf '#!/usr/bin/env bash\nprintf "gpu07\\ngpu08\\n"\n' >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  # sbatch --export=ALL carries the login shell's (or an outer job's) MASTER_ADDR
  MASTER_ADDR=127.0.0.1 MASTER_PORT=23456 SLURM_JOB_NODELIST='gpu[07-08]' \
    run bash -c 'source "$1"; export_rendezvous; echo "$MASTER_ADDR:$MASTER_PORT"' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_success
  assert_output gpu07:23456
  SLURM_JOB_NODELIST='gpu[07-08]' run bash -c 'unset MASTER_PORT; source "$1"; export_rendezvous; echo "$MASTER_ADDR:$MASTER_PORT"' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_output "gpu07:$(bash -c 'source "$1"; master_port' _ "$BATS_TEST_TMPDIR/node/lib.sh")"
}

@test "record_job_id: a job started by hand (sbatch job.sbatch) becomes the submission's job_id; an older one never replaces a newer" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$HPC_SUBMISSION_DIR"
  run bash -c 'source "$1"; SLURM_JOB_ID=13 record_job_id; cat "$HPC_SUBMISSION_DIR/job_id"' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_output 13
  run bash -c 'source "$1"; SLURM_JOB_ID=39 record_job_id; SLURM_JOB_ID=20 record_job_id; cat "$HPC_SUBMISSION_DIR/job_id"' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_output 39
  # an array task records its array's id
  run bash -c 'source "$1"; SLURM_JOB_ID=52 SLURM_ARRAY_JOB_ID=50 SLURM_ARRAY_TASK_ID=2 record_job_id; cat "$HPC_SUBMISSION_DIR/job_id"' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_output 50
  assert_equal "$(find "$HPC_SUBMISSION_DIR" -type f | wc -l)" 1
}

# scontrol_preempting PREEMPT_TIME MODE: 'show job' says PreemptTime, 'show partition' PreemptMode.
scontrol_preempting() {
  cat >"$bin/scontrol" <<STUB
#!/usr/bin/env bash
case "\$2" in
  job) echo "JobId=77 JobState=RUNNING Reason=None Requeue=1 Restarts=0 Partition=p PreemptEligibleTime=2026-11-26T19:46:55 PreemptTime=$1 SuspendTime=None" ;;
  partition) echo "PartitionName=p Nodes=node[1-2] PriorityTier=1 PreemptMode=$2 State=UP" ;;
esac
STUB
  chmod +x "$bin/scontrol"
}

@test "being_preempted: a PreemptTime on a partition that preempts by requeueing, not otherwise" {
  export SLURM_JOB_PARTITION=p
  scontrol_preempting 2026-11-26T19:46:59 REQUEUE
  run being_preempted
  assert_success
  scontrol_preempting 2026-11-26T19:46:59 GANG,REQUEUE
  run being_preempted
  assert_success
  scontrol_preempting None REQUEUE
  run being_preempted
  assert_failure
  scontrol_preempting 2026-11-26T19:46:59 CANCEL
  run being_preempted
  assert_failure
}

# key_from CONTENT: load_wandb_credentials on a private file holding CONTENT;
# prints the WANDB_API_KEY it exported, or <unset>.
key_from() {
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  (umask 077 && printf '%s' "$1" >"$HOME/wandb_credentials.txt")
  unset WANDB_API_KEY
  load_wandb_credentials
  printf '%s\n' "${WANDB_API_KEY-<unset>}"
}

@test "load_wandb_credentials: the key alone, or the WANDB_API_KEY line of a dotenv file; other lines are not part of the key" {
  run key_from $'0123abcd\n'
  assert_output 0123abcd
  run key_from $'  0123abcd  \r\n\n'
  assert_output 0123abcd
  run key_from $'WANDB_API_KEY=0123abcd\n'
  assert_output 0123abcd
  run key_from $'# my W&B key\nexport WANDB_API_KEY="0123abcd"\nWANDB_ENTITY=me\nWANDB_BASE_URL=https://wandb.example.org\n'
  assert_output 0123abcd
  run key_from $'WANDB_ENTITY=me\nWANDB_API_KEY=\'0123abcd\'\n'
  assert_output 0123abcd
}

@test "load_wandb_credentials: a file without a key it can tell says so on stderr and exports none" {
  run --separate-stderr key_from $'WANDB_ENTITY=me\nWANDB_PROJECT=p\n'
  assert_output "<unset>"
  assert_equal "$stderr" "hpc: error: $BATS_TEST_TMPDIR/home/wandb_credentials.txt holds no W&B key (the key alone on one line, or a line WANDB_API_KEY=<key>); W&B gets none from it"
  run --separate-stderr key_from $'first\nsecond\n'
  assert_output "<unset>"
  assert_equal "$stderr" "hpc: error: $BATS_TEST_TMPDIR/home/wandb_credentials.txt holds no W&B key (the key alone on one line, or a line WANDB_API_KEY=<key>); W&B gets none from it"
  run --separate-stderr key_from $'\n# nothing yet\n'
  assert_output "<unset>"
  assert_equal "$stderr" ""
}

# load_key: load_wandb_credentials on the file as it is; prints the
# WANDB_API_KEY it exported, or <unset>.
load_key() {
  load_wandb_credentials
  printf '%s\n' "${WANDB_API_KEY-<unset>}"
}

@test "load_wandb_credentials: a link to a private key file gives its key (the file's mode is checked, not the link's 777)" {
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME" "$BATS_TEST_TMPDIR/keys"
  (umask 077 && printf 'WANDB_API_KEY=0123abcd\n' >"$BATS_TEST_TMPDIR/keys/wandb.txt")
  ln -s "$BATS_TEST_TMPDIR/keys/wandb.txt" "$HOME/wandb_credentials.txt"
  unset WANDB_API_KEY
  run --separate-stderr load_key
  assert_output 0123abcd
  assert_equal "$stderr" ""
}

@test "check_venv: a venv whose requirements changed since submission (a later --setup-venv) is said in the log; the same is not" {
  local venv="$BATS_TEST_TMPDIR/venv"
  mkdir -p "$venv"
  echo aaaa1111bbbb2222 >"$venv/.hpc-requirements.sha256"
  HPC_VENV=$venv HPC_VENV_DIGEST=aaaa1111bbbb2222 run check_venv
  assert_success
  assert_output ""
  echo cccc3333dddd4444 >"$venv/.hpc-requirements.sha256"
  HPC_VENV=$venv HPC_VENV_DIGEST=aaaa1111bbbb2222 run check_venv
  assert_success
  assert_output "hpc: warning: $venv now holds other requirements than at submission (digest cccc3333dddd, was aaaa1111bbbb: a later --setup-venv changed it); this job runs with them"
  rm "$venv/.hpc-requirements.sha256"
  HPC_VENV=$venv HPC_VENV_DIGEST=aaaa1111bbbb2222 run check_venv
  assert_output "hpc: warning: $venv holds no finished --setup-venv (its digest stamp is gone: a setup failed, or is running); this job runs with it as it is"
  # No stamp recorded at submission (a venv never set up by --setup-venv): nothing to say.
  HPC_VENV=$venv HPC_VENV_DIGEST="" run check_venv
  assert_output ""
}

@test "check_venv: waits while a --setup-venv job installs into the venv (its lock), then goes on" {
  local venv="$BATS_TEST_TMPDIR/venv"
  mkdir -p "$venv"
  echo aaaa1111bbbb2222 >"$venv/.hpc-requirements.sha256"
  # The setup job's exclusive lock, held for 2 s; also for a venv no --setup-venv
  # made (no digest recorded at submission): a later one may be installing into it.
  local digest
  for digest in aaaa1111bbbb2222 ""; do
    flock -x "$venv.lock" sleep 2 &
    sleep 0.3
    SECONDS=0
    HPC_VENV=$venv HPC_VENV_DIGEST=$digest run check_venv
    assert_success
    ((SECONDS >= 1)) || fail "check_venv did not wait for the setup's lock (${SECONDS}s, digest '$digest')"
    assert_output "hpc: a --setup-venv job is installing into $venv; waiting for it (at most 30 min)"
    wait
  done
}

@test "claim_first_run: the first job to run a trial of the folder writes its key; later jobs and requeues leave it" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$HPC_SUBMISSION_DIR"
  run bash -c 'source "$1"; SLURM_JOB_ID=52 SLURM_ARRAY_JOB_ID=50 SLURM_ARRAY_TASK_ID=2 claim_first_run; SLURM_JOB_ID=61 SLURM_ARRAY_JOB_ID=60 SLURM_ARRAY_TASK_ID=2 claim_first_run; SLURM_JOB_ID=62 SLURM_ARRAY_JOB_ID=60 SLURM_ARRAY_TASK_ID=3 claim_first_run' _ "$BATS_TEST_TMPDIR/node/batch_functions.sh"
  assert_success
  assert_output ""
  assert_equal "$(cat "$HPC_SUBMISSION_DIR/runs/first.2")" 50_2
  assert_equal "$(cat "$HPC_SUBMISSION_DIR/runs/first.3")" 60_3
}
