#!/usr/bin/env bash
# Runs `wandb agent ARGS...` (one array task of a wandb sweep, started by
# launch.sh inside the runtime) and speaks the requeue protocol for it.
#
# Exit status: `wandb agent` itself exits 0 even when every run failed. The
# agent starts a run with the sweep's command, found on PATH: `python` by
# default, or a launcher (torchrun, accelerate, deepspeed). A shim of each,
# first on PATH, runs the real one and records the run's exit status; this
# script exits with the first non-zero one, or 42 (HPC_REQUEUE_EXIT_CODE) when
# a run checkpointed at a signal and asked to be requeued. A command the shims
# cannot see (an absolute path) runs untracked: the log says so when the agent
# ran no run through them.
#
# Signals (USR1 at the wall time, TERM at preemption): this script, the agent
# and the run all trap them; none dies of them. The script forwards the signal
# to the run's shim, and USR1 also to the agent (started with --forward-signals,
# so it passes signals on to its run and waits for it); the shim forwards it to
# the program. The program starts with USR1 ignored, and the shim delivers USR1
# once the program catches it (its handler shows in /proc/PID/status): a signal
# that comes while it imports is then neither lost nor fatal. The harness
# checkpoints, tells W&B the run is preempting, and exits 42.
#
# Requeue: W&B hands a preempted run (marked preempting, then exited non-zero)
# to the next agent of the sweep that asks for work, before any new point, with
# the same run id and parameters. So the requeued task's `wandb agent --count 1`
# gets the run back (or another task gets it, if it asks first). Each run's
# files live under its run id, $scratch_dir/$exp_name/runs/<run id> (the run
# sees it as HPC_TRIAL_DIR; the harness keeps checkpoints/ there), never under
# the array index: whoever gets a run resumes that run's checkpoint, and a new
# run never finds another run's. The task's own folder keeps a log of the runs
# it ran (wandb_runs.txt: run id, exit status and job id, one run per line).
#
# Usage: wandb_agent.sh agent [--count N] SWEEP_ID
set -euo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

signal_seen=""
agent_pid=""

# shellcheck disable=SC2317 # called from the traps
on_signal() {
  local sig=$1 pidfile
  signal_seen=$sig
  printf '%s\n' "$sig" >"$status_dir/signal"
  hpc_log "wandb_agent.sh: received SIG$sig; forwarding it to the wandb run"
  # USR1 also to the agent, which passes it on (--forward-signals). Not TERM:
  # the agent counts TERMs (wait, then terminate, then SIGKILL its run at the
  # third), and SLURM may already have sent it one or two.
  if [[ "$sig" == USR1 && -n "$agent_pid" ]]; then
    kill -s USR1 "$agent_pid" 2>/dev/null || true
  fi
  for pidfile in "$status_dir"/*.pid; do
    [[ -e "$pidfile" && ! -e "${pidfile%.pid}.status" ]] || continue
    kill -s "$sig" "$(<"$pidfile")" 2>/dev/null || true
  done
}

# runs_folder: where each run's files go, under its run id.
runs_folder() {
  local folder=${HPC_TRIAL_DIR:-$PWD}
  [[ -z "${scratch_dir:-}" || -z "${exp_name:-}" ]] || folder=$scratch_dir/$exp_name
  printf '%s/runs' "$folder"
}

# The commands a sweep's run may start with, each shimmed when on PATH.
readonly RUN_LAUNCHERS="python python3 torchrun accelerate deepspeed"

# write_shims: a shim in $status_dir/bin for each of RUN_LAUNCHERS on PATH
# (python3 falls back to python's real one).
write_shims() {
  local name real real_python
  real_python=$(command -v python || command -v python3) || {
    hpc_error "no python on PATH for the wandb agent's runs"
    exit 1
  }
  mkdir -p "$status_dir/bin"
  for name in $RUN_LAUNCHERS; do
    if ! real=$(command -v "$name"); then
      [[ "$name" == python* ]] || continue
      real=$real_python
    fi
    write_shim "$name" "$real"
  done
}

# write_shim NAME REAL: the shim NAME, which runs REAL as one wandb run.
write_shim() {
  local name=$1 real=$2 runs
  runs=$(runs_folder)
  cat >"$status_dir/bin/$name" <<SHIM
#!/usr/bin/env bash
# Written by wandb_agent.sh: runs one wandb run in its own folder, forwards
# USR1/TERM to it and records its exit status. The program starts with USR1
# ignored; a USR1 is delivered once the program catches it (its handler shows
# in /proc/PID/status), so an early one is neither lost nor fatal. A shimmed
# command the run itself starts (a python subprocess) is the run's own
# business: it runs as it is.
[[ -z "\${HPC_WANDB_RUN_TRACKED:-}" ]] || exec $(printf '%q' "$real") "\$@"
set -uo pipefail
run=\${WANDB_RUN_ID:-run\$\$}
export HPC_WANDB_RUN_TRACKED=\$run
export HPC_TRIAL_DIR=$(printf '%q' "$runs")/"\$run"
mkdir -p "\$HPC_TRIAL_DIR"
pending=""
child=""
usr1=\$(kill -l USR1)
catches_usr1() {
  local mask
  mask=\$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/\$child/status" 2>/dev/null) || return 1
  [[ -n "\$mask" ]] && (((16#\$mask >> (usr1 - 1)) & 1))
}
deliver() {
  [[ -n "\$pending" && -n "\$child" ]] || return 0
  [[ "\$pending" != USR1 ]] || catches_usr1 || return 0
  kill -s "\$pending" "\$child" 2>/dev/null || true
  pending=""
}
on_signal() {
  pending=\$1
  deliver
}
# Ignored from before the fork, so that the program never sees USR1's default.
trap '' USR1
$(printf '%q' "$real") "\$@" &
child=\$!
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM
printf '%s\n' "\$\$" >$(printf '%q' "$status_dir")/"\$run.pid"
if [[ -e $(printf '%q' "$status_dir/signal") ]]; then
  pending=\$(<$(printf '%q' "$status_dir/signal"))
fi
while :; do
  if [[ -n "\$pending" ]]; then
    deliver
    if [[ -n "\$pending" ]] && kill -0 "\$child" 2>/dev/null; then
      sleep 0.2
      continue
    fi
  fi
  wait "\$child"
  status=\$?
  if ((status > 128)); then
    # A trapped signal ends wait early: wait again while the program runs,
    # and take its own status if it ended meanwhile.
    ! kill -0 "\$child" 2>/dev/null || continue
    wait "\$child"
    status=\$?
  fi
  break
done
printf '%s\n' "\$status" >$(printf '%q' "$status_dir")/"\$run.status"
exit "\$status"
SHIM
  chmod +x "$status_dir/bin/$name"
}

# agent_argv ARGS...: wandb's argv, with --forward-signals after 'agent'.
agent_argv() {
  local arg
  argv=(wandb "$1")
  shift
  for arg in "$@"; do
    [[ "$arg" != --forward-signals && "$arg" != -f ]] || {
      argv+=("$@")
      return 0
    }
  done
  argv+=(--forward-signals "$@")
}

run_agent() {
  agent_status=0
  # USR1 ignored (from before the fork) until the agent starts its run and
  # forwards signals: an early wall-time signal reaches the run via the shim.
  trap '' USR1
  PATH="$status_dir/bin:$PATH" "${argv[@]}" &
  agent_pid=$!
  trap 'on_signal USR1' USR1
  [[ -z "$signal_seen" ]] || hpc_log "wandb_agent.sh: SIG$signal_seen came before the agent started; its run gets it"
  while :; do
    # wait returns early (status > 128) when a trapped signal arrives.
    agent_status=0
    wait "$agent_pid" || agent_status=$?
    if ((agent_status > 128)); then
      ! kill -0 "$agent_pid" 2>/dev/null || continue
      agent_status=0
      wait "$agent_pid" || agent_status=$?
    fi
    break
  done
  agent_pid=""
}

main() {
  local file run status runs=0 requeue_run="" failed_run="" failed_status=0
  status_dir=$(mktemp -d "${TMPDIR:-/tmp}/hpc-wandb.XXXXXX")
  trap 'rm -rf -- "${status_dir:?}"' EXIT
  trap 'on_signal USR1' USR1
  trap 'on_signal TERM' TERM
  write_shims
  agent_argv "$@"
  run_agent
  for file in "$status_dir"/*.status; do
    [[ -e "$file" ]] || continue
    runs=$((runs + 1))
    status=$(<"$file")
    run=${file##*/}
    run=${run%.status}
    # The job too: trials/K is shared by every submission of the experiment.
    [[ -z "${HPC_TRIAL_DIR:-}" ]] ||
      printf '%s %s %s\n' "$run" "$status" "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:--}}" >>"$HPC_TRIAL_DIR/wandb_runs.txt"
    if [[ "$status" == "$HPC_REQUEUE_EXIT_CODE" ]]; then
      requeue_run=${requeue_run:-$run}
    elif [[ "$status" != 0 && -z "$failed_run" ]]; then
      failed_run=$run
      failed_status=$status
    fi
  done
  if [[ -n "$failed_run" ]]; then
    hpc_error "wandb run $failed_run exited with code $failed_status (wandb agent reported success)"
    exit "$failed_status"
  fi
  if [[ -n "$requeue_run" ]]; then
    hpc_log "wandb run $requeue_run checkpointed${signal_seen:+ at SIG$signal_seen}; exiting $HPC_REQUEUE_EXIT_CODE (requeue me: W&B gives the preempted run back to the next agent)"
    exit "$HPC_REQUEUE_EXIT_CODE"
  fi
  if [[ -n "$signal_seen" ]] && ((runs == 0)); then
    hpc_log "SIG$signal_seen came before the wandb agent started a run; exiting $HPC_REQUEUE_EXIT_CODE (requeue me)"
    exit "$HPC_REQUEUE_EXIT_CODE"
  fi
  ((agent_status == 0)) || exit "$agent_status"
  if ((runs == 0)); then
    hpc_log "wandb agent ended without a run through the toolkit's shims ($RUN_LAUNCHERS): the sweep had no work left, or its command starts the program another way (an absolute path), whose exit code and folder are then not tracked"
    return 0
  fi
  hpc_log "wandb agent finished $runs run(s), all succeeded"
}

main "$@"
