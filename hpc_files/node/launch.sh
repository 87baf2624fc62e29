#!/usr/bin/env bash
# One srun task of the training step (started by batch.sh). Builds the
# command of this trial and runs it in the runtime (venv or container):
#   lightning, none  the trial's command as it is (one task per GPU / one task)
#   torchrun         torchrun --nnodes=N --nproc-per-node=G with c10d
#                    rendezvous at MASTER_ADDR:MASTER_PORT (or --standalone),
#                    each worker under torchrun_worker.sh, which records its
#                    exit code (torchrun exits 1 for any failed worker)
# Then records this task's exit status in the run folder (record_exit, lib.sh),
# so batch.sh can tell which rank failed first, and exits with it: under
# torchrun, when it failed, the code of the worker that failed first.
#
# Signals: with proctrack/linuxproc or pgid SLURM delivers a step's signals to
# every process of the step, so the program receives USR1/TERM directly; with
# proctrack/cgroup (production clusters) only this shell, the step's task,
# receives them (SIGKILL aside), and it forwards them to the program
# (signals_reach_task_only, lib.sh). torchrun forwards them too when it
# supports --signals-to-handle (each torchrun flag is probed on its own); an
# older torchrun is made to ignore the wall-time signal (USR1 unless --signal
# says otherwise), so it does not tear its workers down while they checkpoint.
set -euo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

# torchrun_program_args ARGV...: the command each torchrun worker runs (under
# torchrun_worker.sh) for ARGV, into torchrun_program: ARGV itself, with
# python's -u added (unbuffered, as torchrun runs a script) when ARGV runs
# python ([/usr/bin/env] python[3[.N]] ...). The interpreter is the one the
# line names, found on PATH as on a laptop: an image may have python3 alone.
torchrun_program_args() {
  local -a words=("$@")
  local at=0
  [[ "${words[0]}" != /usr/bin/env && "${words[0]}" != env ]] || at=1
  torchrun_program=("${words[@]}")
  case "${words[at]:-}" in
    python | python3 | python3.* | */python | */python3 | */python3.*)
      [[ "${words[at + 1]:-}" == -u ]] ||
        torchrun_program=("${words[@]:0:at+1}" -u "${words[@]:at+1}")
      ;;
  esac
}

# torchrun_flags: which of --signals-to-handle and --shutdown-timeout this
# torchrun knows, read from its source without importing torch (one process).
# They came in different releases (2.10 and 2.12), so each is probed on its
# own. Sets torchrun_has_signals and torchrun_has_shutdown_timeout to 1 or 0.
torchrun_flags() {
  local answer
  torchrun_has_signals=0
  torchrun_has_shutdown_timeout=0
  answer=$(runtime_exec_capture python -c '
import importlib.util, pathlib
spec = importlib.util.find_spec("torch")
run_py = pathlib.Path(spec.submodule_search_locations[0], "distributed", "run.py") if spec else None
text = run_py.read_text() if run_py and run_py.is_file() else ""
print(int("signals-to-handle" in text), int("shutdown-timeout" in text))
' 2>/dev/null) || return 0
  [[ "$answer" != 1\ * ]] || torchrun_has_signals=1
  [[ "$answer" != *\ 1 ]] || torchrun_has_shutdown_timeout=1
}

# drop_fresh_after_first_run WORD...: the words into kept_words, less every
# '--fresh' when another job ran this trial of the submission folder first
# (first_run_file): --fresh starts a submission over once; a later sbatch of
# the same job.sbatch resumes. The first job's requeues keep it: the harness
# tells its own folder by the job id and restart count.
drop_fresh_after_first_run() {
  local first word
  kept_words=("$@")
  first=$(cat "$(first_run_file)" 2>/dev/null) || return 0
  [[ -n "$first" && "$first" != "$(job_key)" ]] || return 0
  kept_words=()
  for word in "$@"; do
    [[ "$word" == --fresh ]] || kept_words+=("$word")
  done
  if ((${#kept_words[@]} != $#)) && [[ "${SLURM_PROCID:-0}" == 0 ]]; then
    hpc_log "without --fresh: job $first ran trial $(trial_index) of this submission first, started afresh; this run resumes"
  fi
}

# shellcheck disable=SC2120 # 'set --' below replaces the positional words on purpose
build_command() {
  local line assignment
  local -a assignments=()
  line=$(trial_command_line) || exit 1
  # The trial's words, with $VARS expanded here on the node, as the user wrote
  # them; as in the shell, an unset variable expands to nothing. Globs and
  # braces stay as written (set -f, +B), as --list-trials shows them: this
  # node's folder is not the one the line was written in.
  set +u -f +B
  eval "set -- $line"
  set -u +f -B
  # Leading NAME=value words are the command's environment, as in the shell.
  while (($# > 0)) && [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    assignments+=("$1")
    shift
  done
  drop_fresh_after_first_run "$@"
  set -- ${kept_words[@]+"${kept_words[@]}"}
  for assignment in ${assignments[@]+"${assignments[@]}"}; do
    export "${assignment?}"
    # A container gets only the variables it is given: these too.
    HPC_PASS_ENV="${HPC_PASS_ENV:+$HPC_PASS_ENV }${assignment%%=*}"
    export HPC_PASS_ENV
  done
  (($# > 0)) || {
    hpc_error "trial $(trial_index) has an empty command"
    exit 1
  }
  case "$HPC_KIND" in
    lightning | none)
      command_argv=("$@")
      if [[ "$1" == wandb && "${2:-}" == agent ]]; then
        # wandb agent exits 0 even when its runs failed: wrap it.
        command_argv=(bash "$HPC_SUBMISSION_DIR/node/wandb_agent.sh" "${@:2}")
      fi
      ;;
    torchrun)
      torchrun_program_args "$@"
      command_argv=(torchrun --nnodes="$HPC_NODES" --nproc-per-node="$HPC_PROCS_PER_NODE" --max-restarts=0)
      if ((HPC_NODES > 1)); then
        # The first node hosts the rendezvous store; say so rather than rely on
        # torchrun matching its own hostname.
        local is_host=false
        [[ "${SLURM_NODEID:-0}" != 0 ]] || is_host=true
        command_argv+=(--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
          --rdzv-id="$(job_key)" --rdzv-conf="is_host=$is_host")
      else
        command_argv+=(--standalone)
      fi
      torchrun_flags
      if ((torchrun_has_signals)); then
        local signals=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
        # The wall-time signal (--signal) too, where it is another one.
        [[ -z "$wall_signal" || ",$signals," == *",SIG$wall_signal,"* ]] || signals+=",SIG$wall_signal"
        command_argv+=("--signals-to-handle=$signals")
        if ((torchrun_has_shutdown_timeout)); then
          local grace=$((HPC_SIGNAL_LEAD > 45 ? HPC_SIGNAL_LEAD - 15 : 30))
          command_argv+=(--shutdown-timeout="$grace")
        fi
      else
        ignore_wall_signal=1
      fi
      if [[ -n "${HPC_PASS_LOCAL_RANK:-}" ]]; then
        # torchrun sets LOCAL_RANK per worker; a shim turns it into the
        # --local-rank argument old torch.distributed.launch programs expect.
        torchrun_program=(bash "$HPC_SUBMISSION_DIR/node/local_rank_shim.sh" --no-python "${torchrun_program[@]}")
      fi
      command_argv+=(--no-python bash "$HPC_SUBMISSION_DIR/node/torchrun_worker.sh" "${torchrun_program[@]}")
      ;;
    *)
      hpc_error "unknown HPC_KIND '$HPC_KIND'"
      exit 1
      ;;
  esac
}

# worker_status STATUS: torchrun's exit status STATUS when it is 0; else the
# code of the worker that failed first, on any node, as torchrun_worker.sh
# recorded it (first_failure, lib.sh: by the time its record was written);
# STATUS itself when no worker recorded a failure (a failed rendezvous, say).
worker_status() {
  local record
  if (($1 != 0)) && record=$(first_failure rank); then
    printf '%s' "${record%% *}"
  else
    printf '%s' "$1"
  fi
}

# signal_before_start: a signal came before the program started (during the
# torchrun probe, say: seconds in a container). Nothing ran, so nothing is
# lost: the wall-time signal asks for a requeue (the marker, exit 42), TERM
# ends the task.
signal_before_start() {
  if [[ "$pending_signal" == "$wall_signal" ]]; then
    hpc_log "SIG$pending_signal came before the program started; asking for a requeue without running it"
    printf '{"reason": "signal before the program started"}\n' >"${HPC_REQUEUE_MARKER:?}"
    record_exit "$HPC_REQUEUE_EXIT_CODE"
    exit "$HPC_REQUEUE_EXIT_CODE"
  fi
  record_exit 143
  exit 143
}

# run_program: the trial's command in the runtime, replacing this (sub)shell;
# an older torchrun ignores the wall-time signal (see the header).
run_program() {
  if ((ignore_wall_signal)) && [[ -n "$wall_signal" ]]; then
    trap '' "$wall_signal"
  fi
  runtime_exec "${command_argv[@]}"
}

# forward_signal SIG: pass SIG on to the program (it may have ended).
# shellcheck disable=SC2317 # called from traps
forward_signal() {
  kill -s "$1" "$program_pid" 2>/dev/null || true
}

# wait_program: the program's exit status, once it has ended; a trapped
# signal interrupts 'wait', so wait again while the program is there.
wait_program() {
  local status=0
  wait "$program_pid" || status=$?
  while kill -0 "$program_pid" 2>/dev/null; do
    status=0
    wait "$program_pid" || status=$?
  done
  return "$status"
}

main() {
  local status=0
  command_argv=()
  ignore_wall_signal=0
  # The wall-time signal: --signal's, USR1 by default, none with --no-signal.
  wall_signal=${HPC_SIGNAL-USR1}
  # Until the program runs, a signal is remembered rather than fatal.
  pending_signal=""
  trap 'pending_signal=TERM' TERM
  # shellcheck disable=SC2064 # the signal's name is fixed now, on purpose
  [[ -z "$wall_signal" ]] || trap "pending_signal=$wall_signal" "$wall_signal"
  if uses_mimic_tmpdir; then
    SLURM_TMPDIR=$(mimic_tmpdir "${SLURMD_NODENAME:-$(hostname -s)}")
    export SLURM_TMPDIR
  fi
  # Relative paths in experiment lines mean the project root, as on a laptop.
  cd "${source_dir:?}" || exit 1
  load_runtime
  # shellcheck disable=SC2119 # see build_command
  build_command
  [[ -z "$pending_signal" ]] || signal_before_start
  # The program handles the signals; this shell only outlives it to record
  # its status (traps run after the foreground program ends). Where SLURM
  # signals this shell alone, the program runs in the background and this
  # shell passes the signals on; under job control (set -m), as bash 4.2
  # would start a plain '(...) &' with SIGINT and SIGQUIT ignored.
  trap ':' TERM ${wall_signal:+"$wall_signal"}
  if signals_reach_task_only; then
    set -m
    (run_program) &
    program_pid=$!
    set +m
    trap 'forward_signal TERM' TERM
    # shellcheck disable=SC2064 # the signal's name is fixed now, on purpose
    [[ -z "$wall_signal" ]] || trap "forward_signal $wall_signal" "$wall_signal"
    wait_program || status=$?
  else
    (run_program) || status=$?
  fi
  # The program has ended: a signal now (srun's TERM as it ends the other
  # tasks after one failed) must not cut the recording short; the subshells
  # and commands below inherit the ignored signals.
  trap '' TERM ${wall_signal:+"$wall_signal"}
  [[ "$HPC_KIND" != torchrun ]] || status=$(worker_status "$status")
  record_exit "$status"
  exit "$status"
}

main "$@"
