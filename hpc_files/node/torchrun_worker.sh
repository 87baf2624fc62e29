#!/usr/bin/env bash
# One torchrun worker (launch.sh starts torchrun with --no-python and this
# script): runs COMMAND as a child, records its exit status with the worker's
# RANK in the run folder (record_exit, lib.sh: <run>/exit/rank<RANK>) and exits
# with it. torchrun itself exits 1 whatever its workers' codes were; launch.sh
# reads these records to exit with the code of the worker that failed first,
# and batch.sh names that rank in the log. A worker killed by a signal counts
# as 128+N, as bash reports it.
#
# Signals: torchrun passes TERM, INT, HUP, QUIT, USR1 and the wall-time signal
# on to its workers (torch 2.2 and later to each worker's process group: this
# script and the program; older ones to this script alone), and SLURM signals
# every process of the step. This script never dies of them: it passes each
# one on to the program (a second delivery is harmless: the harness's handlers
# only set a flag) and waits until the program has really ended. While the
# program runs it costs nothing measurable: a shell that looks five times a
# second whether its child still runs (run_worker says why not 'wait').
# Under bash 4.2 (EL7) the program starts with INT and QUIT ignored, as bash
# starts every background command there; bash 4.3 and later restore them.
#
# Usage: torchrun_worker.sh COMMAND [ARG...]
set -euo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

child=""
pending=""
signals=0

# forward SIG: pass a signal this script received on to the program; one that
# comes before the program started is passed on as soon as it has.
# shellcheck disable=SC2317 # called from the traps
forward() {
  signals=$((signals + 1))
  if [[ -n "$child" ]]; then
    kill -s "$1" "$child" 2>/dev/null || true
  else
    pending=$1
  fi
}

# run_worker COMMAND...: runs it as a child, into worker_status.
# While the program runs, this script checks five times a second whether it
# still does, sleeping in between in 'read -t' on a pipe that never has data
# (no process is started; 'sleep' under bash 4.2), never in 'wait': bash 5 can lose a child's exit
# status for good when a trapped signal cuts a 'wait' short just as the child
# ends (wait then answers -1), and at a requeue the signals come just then.
# Bash reaps the child itself meanwhile, at whatever command runs then, and
# prints 'Killed' for one a signal ended: this script's stderr is closed to
# bash from the child's start on (the line would name this script, not the
# program; the exit code says it), and the program writes to a saved copy.
run_worker() {
  local tick seen err
  exec {err}>&2
  {
    # The program gets this script's stdin (bash would give a background
    # command /dev/null) and INT and QUIT as they came (bash would ignore them).
    (
      trap - INT QUIT
      exec "$@" 2>&"$err" {err}>&-
    ) <&0 &
    child=$!
    [[ -z "$pending" ]] || forward "$pending"
    # A pipe this script holds both ends of: a read on it only times out.
    # Bash 4.2 loses the trap of a signal that comes during 'read -t' when
    # short of CPU (or aborts on a double free): it sleeps in 'sleep' there.
    tick=""
    if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 403)); then
      exec {tick}<> <(:) || tick=""
    fi
    while kill -0 "$child"; do
      if [[ -n "$tick" ]]; then
        read -r -t 0.2 -u "$tick" _ || true
      else
        sleep 0.2 || true
      fi
    done
    [[ -z "$tick" ]] || exec {tick}>&-
    while :; do
      seen=$signals
      worker_status=0
      wait "$child" || worker_status=$?
      ((worker_status > 128 && seen != signals)) || break
    done
  } 2>/dev/null
  exec {err}>&-
}

main() {
  local sig wall_signal=${HPC_SIGNAL-USR1}
  : "${RANK:?torchrun sets RANK}"
  (($# > 0)) || {
    hpc_error "torchrun_worker.sh: no command to run"
    exit 2
  }
  for sig in TERM INT HUP QUIT USR1 USR2 ${wall_signal:+"$wall_signal"}; do
    # shellcheck disable=SC2064 # the signal's name is fixed now, on purpose
    trap "forward $sig" "$sig"
  done
  run_worker "$@"
  # The program has ended: a signal now (torchrun or srun ending the others)
  # must not cut the recording short (its subshells would die of it).
  trap '' TERM INT HUP QUIT USR1 USR2 ${wall_signal:+"$wall_signal"}
  record_exit "$worker_status" "rank$RANK" ||
    hpc_error "torchrun_worker.sh: cannot record rank $RANK's exit code $worker_status in $(run_dir)/exit"
  exit "$worker_status"
}

main "$@"
