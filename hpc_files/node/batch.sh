#!/usr/bin/env bash
# The batch step: exec'd by the rendered job.sbatch, so it keeps the pid SLURM
# signals with --signal=B:$HPC_SIGNAL@lead (USR1 unless --signal/--no-signal).
# In order:
#   1. node-local folders and data: one keeper task per node (keeper.sh) makes
#      the mimic SLURM_TMPDIR where the site has none and extracts the data
#      tarball once per node; training starts only when every node reported ok;
#   2. the training step: srun of launch.sh (one task per GPU for lightning,
#      one per node for torchrun), --kill-on-bad-exit so one failed rank ends it;
#   3. signals: HPC_SIGNAL (wall time) and TERM (preemption, scancel) are forwarded
#      to the step; the program checkpoints and exits;
#   4. requeue: when the program says it checkpointed (harness marker file or
#      exit code 42), 'scontrol requeue' this job (or array task), at most
#      HPC_MAX_REQUEUES times (counted by SLURM_RESTART_COUNT);
#   5. exit with the program's real exit code, so sacct, afterok and mail see
#      FAILED when training failed.
set -uo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

signal_seen=""
step_pid=""
keeper_pid=""
keeper_stage_dir=""
step_status=0

# shellcheck disable=SC2317 # on_signal and on_exit are called from traps
on_signal() {
  local sig=$1 now
  [[ -n "$signal_seen" ]] || signal_seen=$sig
  # printf, not $(date): a trap that forks can make bash lose the step's status.
  printf -v now '%(%F %T)T' -1
  if [[ -n "$step_pid" ]] && kill -0 "$step_pid" 2>/dev/null; then
    hpc_log "received SIG$sig at $now; forwarding it to the training step"
    kill -s "$sig" "$step_pid" 2>/dev/null || true
  else
    hpc_log "received SIG$sig at $now outside the training step"
  fi
}

# on_interrupt: Ctrl-C in an --interactive run. The program gets SIGTERM from
# SLURM, as at a preemption: it checkpoints and ends, then the keepers clean
# up. A second Ctrl-C cancels the allocation at once.
# shellcheck disable=SC2317 # called from a trap
on_interrupt() {
  if [[ "$signal_seen" == INT ]]; then
    hpc_log "second Ctrl-C: cancelling allocation $SLURM_JOB_ID"
    scancel "$SLURM_JOB_ID" 2>/dev/null || true
    return 0
  fi
  signal_seen=INT
  hpc_log "Ctrl-C: SIGTERM to the program (Ctrl-C again cancels the allocation at once)"
  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true
}

# is_wall_time_signal: the signal seen is the one SLURM sends before the wall time.
is_wall_time_signal() {
  [[ -n "$signal_seen" && "$signal_seen" == "$HPC_SIGNAL" ]]
}

stop_keeper() {
  [[ -n "$keeper_pid" ]] || return 0
  if kill -0 "$keeper_pid" 2>/dev/null; then
    # The stop file always reaches the keepers (they look every second); USR2
    # is quicker, but srun forwards it only to the tasks it has seen start.
    # USR2, not TERM: srun answers TERM by killing the tasks outright.
    : >"$keeper_stage_dir/stop"
    kill -s USR2 "$keeper_pid" 2>/dev/null || true
    wait "$keeper_pid" 2>/dev/null || true
  fi
  keeper_pid=""
}

# shellcheck disable=SC2317 # called from the EXIT trap
on_exit() {
  stop_keeper
}

# The API key is read here, on the node, from a file only the user can read;
# it never appears in argv, the script, or the log.
load_wandb_credentials() {
  local file="$HOME/wandb_credentials.txt" mode key
  [[ -f "$file" ]] || return 0
  mode=$(readable_by_others "$file") || mode=""
  if [[ -n "$mode" ]]; then
    hpc_error "$file is readable by others (mode $mode); not using it (chmod 600 it)"
    return 0
  fi
  key=$(wandb_key_in "$file") || {
    hpc_error "$file holds no W&B key (the key alone on one line, or a line WANDB_API_KEY=<key>); W&B gets none from it"
    return 0
  }
  [[ -z "$key" ]] || export WANDB_API_KEY="$key"
}

# unpack_code: the code snapshot taken at submission (code.tar) into code/
# beside it, once for all the submission's jobs and array tasks: each
# unpacks into a folder of its own and renames it into place; whoever comes
# second finds code/ there and drops its copy.
unpack_code() {
  local dir=$HPC_SUBMISSION_DIR unpacked
  [[ -f "$dir/code.tar" && ! -d "$dir/code" ]] || return 0
  unpacked=$(mktemp -d "$dir/.code.XXXXXX") || return 1
  if ! tar -xf "$dir/code.tar" -C "$unpacked"; then
    rm -rf -- "${unpacked:?}"
    hpc_error "cannot unpack the code snapshot $dir/code.tar"
    return 1
  fi
  mv -T -- "$unpacked" "$dir/code" 2>/dev/null || rm -rf -- "${unpacked:?}"
  [[ -d "$dir/code" ]]
}

# check_job_contract: what the requeue protocol needs from sbatch, as this
# job got it. The submitter puts it on sbatch's command line; a job.sbatch
# submitted by hand takes whatever SBATCH_* variables that shell had.
check_job_contract() {
  local requeue
  # salloc's allocation is never requeued, and takes no --signal.
  [[ -z "${HPC_INTERACTIVE:-}" ]] || return 0
  requeue=$(record_field "$(job_record "$(job_key)")" Requeue) || true
  if [[ "$requeue" == 0 ]]; then
    hpc_error "this job may not be requeued (--no-requeue or SBATCH_NO_REQUEUE at submission): at the wall time it checkpoints and ends; sbatch job.sbatch again to continue"
  fi
  [[ -z "${HPC_CONTRACT_ON_COMMAND_LINE:-}" ]] || return 0
  if [[ -n "${SBATCH_SIGNAL:-}" ]]; then
    hpc_error "SBATCH_SIGNAL=$SBATCH_SIGNAL at submission replaced this script's --signal=B:$HPC_SIGNAL@$HPC_SIGNAL_LEAD: the job may get no warning before its wall time"
  fi
  if [[ -n "${SBATCH_OPEN_MODE:-}" && "$SBATCH_OPEN_MODE" != a* ]]; then
    hpc_error "SBATCH_OPEN_MODE=$SBATCH_OPEN_MODE at submission: the log starts again at every requeue"
  fi
  if [[ -n "${SBATCH_TIMELIMIT:-}" ]]; then
    hpc_log "SBATCH_TIMELIMIT=$SBATCH_TIMELIMIT at submission replaced this script's --time"
  fi
}

# check_venv: the venv as submitted. A --setup-venv job installing into it
# now (it holds the venv's lock) is waited for, so the program never imports a
# half-installed package. HPC_VENV_DIGEST is the digest of the requirements
# the venv held at submission (or that this submission's --setup-venv
# installs; unset for a venv no --setup-venv made); a later --setup-venv of
# other requirements updates the same venv in place: said in the log.
check_venv() {
  local venv=${HPC_VENV:-} want=${HPC_VENV_DIGEST:-} held lock
  [[ -n "$venv" ]] || return 0
  if [[ -e "$venv.lock" ]] && exec {lock}<"$venv.lock"; then
    if ! flock -s -n "$lock"; then
      hpc_log "a --setup-venv job is installing into $venv; waiting for it (at most 30 min)"
      flock -s -w 1800 "$lock" || hpc_log "warning: $venv's setup still runs after 30 min; going on"
    fi
    exec {lock}<&-
  fi
  [[ -n "$want" ]] || return 0
  held=$(cat "$(venv_stamp "$venv")" 2>/dev/null) || held=""
  if [[ -z "$held" ]]; then
    hpc_log "warning: $venv holds no finished --setup-venv (its digest stamp is gone: a setup failed, or is running); this job runs with it as it is"
  elif [[ "$held" != "$want" ]]; then
    hpc_log "warning: $venv now holds other requirements than at submission (digest ${held:0:12}, was ${want:0:12}: a later --setup-venv changed it); this job runs with them"
  fi
}

# record_job_id: the submission's job_id names the newest job that ran it, also
# one started by hand ('sbatch job.sbatch', later and again), for status.sh and
# results.sh; an older job (a task of an earlier sbatch of this folder starting
# late) does not replace a newer one. Job ids grow.
record_job_id() {
  local id=${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} file="$HPC_SUBMISSION_DIR/job_id" recorded
  [[ "$id" =~ ^[0-9]+$ ]] || return 0
  # The arrays of a sweep split at MaxArraySize, and their retries, are in
  # array_jobs and retry_jobs; job_id stays the first array's.
  [[ "${HPC_TRIAL_OFFSET:-0}" == 0 && ! -f "$HPC_SUBMISSION_DIR/array_jobs" ]] || return 0
  recorded=$(cat "$file" 2>/dev/null) || recorded=0
  [[ "$recorded" =~ ^[0-9]+$ ]] || recorded=0
  ((id > recorded)) || return 0
  { printf '%s\n' "$id" >"$file.$SLURM_JOB_ID" && mv -f "$file.$SLURM_JOB_ID" "$file"; } ||
    hpc_log "warning: cannot record job $id in $file (status.sh shows job $recorded)"
}

# claim_first_run: the first job to run this trial of the submission folder
# writes its job key (a requeue keeps it); launch.sh drops the trial's
# --fresh in any other job ('sbatch job.sbatch' again resumes, as the log
# advises after --max-requeues). The first writer wins (noclobber).
claim_first_run() {
  local file
  file=$(first_run_file)
  [[ ! -e "$file" ]] || return 0
  mkdir -p "${file%/*}" && (set -o noclobber && printf '%s\n' "$(job_key)" >"$file") 2>/dev/null ||
    [[ -e "$file" ]] || hpc_log "warning: cannot write $file; a later sbatch of this folder starts --fresh again"
}

# export_rendezvous: MASTER_ADDR is this allocation's first node, always (one
# that sbatch --export=ALL carried from the submitting shell names a host
# outside this job); MASTER_PORT from the job id unless set (an override).
export_rendezvous() {
  MASTER_ADDR=$(first_node)
  MASTER_PORT=${MASTER_PORT:-$(master_port)}
  export MASTER_ADDR MASTER_PORT
}

decide_tmpdir() {
  case "${HPC_TMPDIR_MODE:-auto}" in
    yes)
      [[ -n "${SLURM_TMPDIR:-}" ]] || {
        hpc_error "the site profile says SLURM_TMPDIR is provided, but it is not set in this job"
        exit 1
      }
      HPC_TMPDIR_MIMIC=0
      ;;
    no) HPC_TMPDIR_MIMIC=1 ;;
    *) if [[ -n "${SLURM_TMPDIR:-}" ]]; then HPC_TMPDIR_MIMIC=0; else HPC_TMPDIR_MIMIC=1; fi ;;
  esac
  export HPC_TMPDIR_MIMIC
  if ((HPC_TMPDIR_MIMIC)); then
    # Each task sets its own (node-specific) value in launch.sh.
    unset SLURM_TMPDIR
  fi
}

# start_keepers: one keeper per node; wait until all report, or one fails.
start_keepers() {
  local nodes=${SLURM_JOB_NUM_NODES:-1} ok failed
  [[ "$HPC_TMPDIR_MIMIC" == 1 || -n "${HPC_DATA_TARBALL:-}" || -n "${HPC_STAGE_OUT:-}" ]] || return 0
  keeper_stage_dir=$(stage_dir)
  rm -rf -- "${keeper_stage_dir:?}"
  mkdir -p "$keeper_stage_dir"
  # Named so that squeue -s and sacct tell it from the training step.
  srun --overlap --job-name=hpc-keeper --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 \
    --cpus-per-task=1 --gres=none --kill-on-bad-exit=0 bash "$HPC_SUBMISSION_DIR/node/keeper.sh" &
  keeper_pid=$!
  while :; do
    failed=$(find "$keeper_stage_dir" -maxdepth 1 -name '*.failed' | head -n 1)
    if [[ -n "$failed" ]]; then
      hpc_error "staging failed on ${failed##*/}: $(<"$failed")"
      return 1
    fi
    ok=$(find "$keeper_stage_dir" -maxdepth 1 -name '*.ok' | wc -l)
    ((ok >= nodes)) && break
    if ! kill -0 "$keeper_pid" 2>/dev/null; then
      wait "$keeper_pid" 2>/dev/null
      ok=$(find "$keeper_stage_dir" -maxdepth 1 -name '*.ok' | wc -l)
      ((ok >= nodes)) && break
      hpc_error "the staging step ended before every node reported (see above)"
      return 1
    fi
    [[ -z "$signal_seen" ]] || return 1
    sleep 0.2
  done
  hpc_log "node-local folders ready on $nodes node(s)"
}

training_step_argv() {
  step_argv=(srun --kill-on-bad-exit=1)
  case "$HPC_KIND" in
    lightning) step_argv+=(--ntasks-per-node="$HPC_PROCS_PER_NODE" --ntasks=$((HPC_NODES * HPC_PROCS_PER_NODE))) ;;
    torchrun) step_argv+=(--ntasks-per-node=1 --ntasks="$HPC_NODES") ;;
    none) step_argv+=(--nodes=1 --ntasks=1) ;;
  esac
  step_argv+=(bash "$HPC_SUBMISSION_DIR/node/launch.sh")
}

run_training_step() {
  local status
  training_step_argv
  "${step_argv[@]}" &
  step_pid=$!
  # A signal that came between '&' and here found no step to forward to.
  [[ -z "$signal_seen" ]] || kill -s "$signal_seen" "$step_pid" 2>/dev/null || true
  # wait returns early (status > 128) when a trapped signal arrives: while the
  # step runs, wait again. When it ended meanwhile, its own status (an exit 42
  # must not become 138) comes from a second wait or, where bash no longer has
  # it (127, or -1 when it was reaped while a trap ran), from what its tasks
  # recorded.
  while :; do
    wait "$step_pid"
    step_status=$?
    ((step_status >= 0 && step_status <= 128)) && break
    kill -0 "$step_pid" 2>/dev/null && continue
    wait "$step_pid" 2>/dev/null
    status=$?
    if ((status >= 0 && status != 127)); then
      step_status=$status
    else
      recorded_step_status
    fi
    break
  done
  step_pid=""
}

# recorded_step_status: the largest exit status the step's tasks recorded
# (exit_records) into step_status; unchanged when none did.
recorded_step_status() {
  local status max=-1
  while read -r status _; do
    ((status <= max)) || max=$status
  done < <(exit_records)
  ((max < 0)) || step_status=$max
}

# report_first_failure: names the task that failed first (srun then killed
# the others) and makes its exit code the step's.
report_first_failure() {
  local record status node name
  record=$(first_failure "") || return 0
  read -r status node name <<<"$record"
  hpc_error "$name on $node exited first, with code $status"
  step_status=$status
}

# requeue_already_requested: someone (Lightning) ran 'scontrol requeue' on
# this job while it ran: SLURM counts the restart at once (Restarts= above
# this run's SLURM_RESTART_COUNT, the job COMPLETING), then shows it
# REQUEUED or pending again. (Not 'Requeue' anywhere in the line: every job
# shows its Requeue=0|1 flag.)
requeue_already_requested() {
  local record state restarts
  record=$(job_record "$(job_key)")
  if state=$(record_field "$record" JobState) && [[ "$state" =~ ^(REQUEUED|REQUEUE_HOLD|PENDING)$ ]]; then
    return 0
  fi
  restarts=$(record_field "$record" Restarts) && [[ "$restarts" =~ ^[0-9]+$ ]] &&
    ((10#$restarts > ${SLURM_RESTART_COUNT:-0}))
}

# being_preempted: SLURM is preempting this job (a PreemptTime) on a partition
# that preempts by requeueing. It signals the steps, not this script: a program
# that dies of the TERM ends the step before the grace time, and the job would
# end FAILED instead of being requeued.
being_preempted() {
  local record when mode
  record=$(job_record "$(job_key)")
  when=$(record_field "$record" PreemptTime) || return 1
  [[ -n "$when" && "$when" != None && "$when" != Unknown ]] || return 1
  record=$(scontrol show partition "${SLURM_JOB_PARTITION:-}" -o 2>/dev/null) || return 1
  mode=$(record_field "$record" PreemptMode) || return 1
  [[ ",$mode," == *,REQUEUE,* ]]
}

requeue_or_stop() {
  local restarts=${SLURM_RESTART_COUNT:-0} key
  if [[ -n "${HPC_INTERACTIVE:-}" ]]; then
    hpc_log "checkpointed; an interactive run is not requeued: run it again to resume"
    [[ "$signal_seen" != INT ]] || exit 130
    exit 0
  fi
  key=$(job_key)
  # The keeper stops on exit (the EXIT trap), after the requeue: stopping it
  # first could wait for a long extraction past the wall time (TIMEOUT).
  if [[ "$signal_seen" == TERM ]]; then
    hpc_log "checkpointed after SIGTERM (preemption or scancel); SLURM requeues preempted jobs itself"
    exit "$HPC_REQUEUE_EXIT_CODE"
  fi
  if ((restarts >= HPC_MAX_REQUEUES)); then
    hpc_error "checkpointed, but this job was already requeued $restarts time(s) (--max-requeues $HPC_MAX_REQUEUES); not requeueing. Resubmit to continue from the checkpoint."
    exit 1
  fi
  # Requeueing a running job makes SLURM send TERM to it, scontrol included:
  # scontrol ignores it (an ignored signal stays ignored across exec), and a
  # scontrol that failed anyway counts when SLURM shows the job requeued.
  if (trap '' TERM && exec scontrol requeue "$key") || requeue_already_requested; then
    hpc_log "requeued $key (restart $((restarts + 1)) of at most $HPC_MAX_REQUEUES); it resumes from the checkpoint"
    exit 0
  fi
  hpc_error "scontrol requeue $key failed; the checkpoint is kept: resubmit to continue"
  exit 1
}

main() {
  local run marker now
  run=$(run_dir)
  mkdir -p "$run"
  # results.sh tells this task's rows from another job's by it (run.json's slurm_job_id).
  printf '%s\n' "${SLURM_JOB_ID:-}" >"$run/slurm_job_id" || hpc_log "warning: cannot write $run/slurm_job_id"
  marker="$run/requeue_marker"
  rm -f -- "$marker"
  rm -rf -- "${run:?}/exit"
  export HPC_REQUEUE_MARKER="$marker"
  # Where this trial keeps its results: per array task, so trials never
  # share a folder; the seed layout ($scratch_dir/$exp_name) for a plain job.
  export HPC_TRIAL_INDEX
  HPC_TRIAL_INDEX=$(trial_index)
  if [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    export HPC_TRIAL_DIR="${scratch_dir:?}/${exp_name:?}/trials/$HPC_TRIAL_INDEX"
  else
    export HPC_TRIAL_DIR="${scratch_dir:?}/${exp_name:?}"
  fi
  mkdir -p "$HPC_TRIAL_DIR"
  # Unset (a script older than --signal) means the default; empty means none.
  HPC_SIGNAL=${HPC_SIGNAL-USR1}
  # shellcheck disable=SC2064 # the signal's name is fixed now, on purpose
  [[ -z "$HPC_SIGNAL" ]] || trap "on_signal $HPC_SIGNAL" "$HPC_SIGNAL"
  trap 'on_signal TERM' TERM
  [[ -z "${HPC_INTERACTIVE:-}" ]] || trap on_interrupt INT
  trap on_exit EXIT
  # Steps inherit this shell's environment, even from an sbatch --export=NONE.
  export SLURM_EXPORT_ENV=ALL
  printf -v now '%(%F %T)T' -1
  hpc_log "job $(job_key) (trial $(trial_index)) on ${SLURM_JOB_NODELIST:-?}, restart ${SLURM_RESTART_COUNT:-0}, started $now"
  check_job_contract
  record_job_id
  claim_first_run
  load_wandb_credentials
  unpack_code || exit 1
  check_venv
  decide_tmpdir
  # One thread pool per process sized to its CPUs (torchrun would pick 1).
  if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    export OMP_NUM_THREADS=$(((${SLURM_CPUS_PER_TASK:-1} * ${SLURM_NTASKS_PER_NODE:-1}) / (HPC_PROCS_PER_NODE > 0 ? HPC_PROCS_PER_NODE : 1)))
    ((OMP_NUM_THREADS >= 1)) || OMP_NUM_THREADS=1
  fi
  export_rendezvous
  if ! start_keepers; then
    [[ -n "$signal_seen" ]] || exit 1
  fi
  if [[ -z "$signal_seen" ]]; then
    run_training_step
  elif is_wall_time_signal; then
    hpc_log "the wall-time signal came before training started; requeueing without running"
    requeue_or_stop
  elif [[ "$signal_seen" == INT ]]; then
    stop_keeper
    hpc_log "interrupted before training started"
    exit 130
  fi
  stop_keeper
  if [[ -f "$marker" || "$step_status" == "$HPC_REQUEUE_EXIT_CODE" ]]; then
    requeue_or_stop
  fi
  if [[ "$step_status" != 0 ]] && being_preempted; then
    hpc_log "preempted: the training step ended with exit code $step_status without a checkpoint marker; requeueing (the program starts again, from its own checkpoints if it keeps any)"
    requeue_or_stop
  fi
  if [[ -n "$signal_seen" ]] && requeue_already_requested; then
    hpc_log "the program requeued the job itself (e.g. Lightning's auto-requeue); leaving it to SLURM"
    exit "$step_status"
  fi
  if is_wall_time_signal && [[ "$step_status" != 0 ]]; then
    hpc_error "the program did not checkpoint at the wall-time signal (no marker, exit $step_status); not requeueing"
  fi
  ((step_status == 0)) || report_first_failure
  printf -v now '%(%F %T)T' -1
  hpc_log "training step ended with exit code $step_status at $now"
  exit "$step_status"
}

main "$@"
