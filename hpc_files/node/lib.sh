# shellcheck shell=bash disable=SC2034
# (SC2034: HPC_REQUEUE_EXIT_CODE is read by the scripts that source this file.)
# Functions shared by the node-side scripts (batch.sh, keeper.sh, launch.sh).
# Sourced; defines functions only. Runs on compute nodes, from the submission
# folder's copy (node/), with the variables the batch script exported.

# shellcheck source=shared.sh
source "${BASH_SOURCE[0]%/*}/shared.sh"

# The exit code the harness uses for "checkpointed at a signal, requeue me".
HPC_REQUEUE_EXIT_CODE=42

hpc_log() {
  printf 'hpc: %s\n' "$*"
}

hpc_error() {
  printf 'hpc: error: %s\n' "$*" >&2
}

# job_key: unique per job and per array task; stable across requeues.
job_key() {
  if [[ -n "${SLURM_ARRAY_JOB_ID:-}" && -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    printf '%s_%s' "$SLURM_ARRAY_JOB_ID" "$SLURM_ARRAY_TASK_ID"
  else
    printf '%s' "$SLURM_JOB_ID"
  fi
}

# trial_index: the array task id, or 0 for a plain job; plus HPC_TRIAL_OFFSET,
# the first trial of this array where a sweep above MaxArraySize went as
# several (submit_job).
trial_index() {
  local offset=${HPC_TRIAL_OFFSET:-0}
  [[ "$offset" =~ ^[0-9]+$ ]] || offset=0
  printf '%s' "$((${SLURM_ARRAY_TASK_ID:-0} + 10#$offset))"
}

run_dir() {
  printf '%s/runs/%s' "$HPC_SUBMISSION_DIR" "$(job_key)"
}

# stage_dir: where the keepers report ('<node>.ok', '<node>.failed') and
# where batch.sh asks them to stop ('stop').
stage_dir() {
  printf '%s/stage' "$(run_dir)"
}

# record_exit STATUS [NAME]: an exit status, for batch.sh and launch.sh: the
# file <run>/exit/NAME holds 'STATUS NODE'. NAME is task<SLURM_PROCID> (the
# default) for a task of the training step (launch.sh), rank<RANK> for a
# torchrun worker (torchrun_worker.sh). Read by exit_records.
record_exit() {
  local dir
  dir=$(run_dir) || return 1
  dir+=/exit
  mkdir -p "$dir"
  printf '%s %s\n' "$1" "${SLURMD_NODENAME:-?}" >"$dir/${2:-task${SLURM_PROCID:-0}}"
}

# exit_records: 'STATUS NODE NAME' for each exit file record_exit wrote in
# this run (tasks and torchrun workers), oldest first by modification time,
# the order they ended in (a worker's record is written before its torchrun
# can see it end); files without a numeric status (cut short) are left out.
exit_records() {
  local dir file status node
  dir="$(run_dir)/exit"
  [[ -d "$dir" ]] || return 0
  while IFS= read -r file; do
    read -r status node <"$file" || [[ -n "$status" ]] || continue
    [[ "$status" =~ ^[0-9]+$ ]] || continue
    printf '%s %s %s\n' "$status" "${node:-?}" "${file##*/}"
  done < <(ls -tr -- "$dir"/task* "$dir"/rank* 2>/dev/null)
}

# first_failure [PREFIX]: 'STATUS NODE NAME' of the oldest non-zero record of
# exit_records whose NAME starts with PREFIX (task, rank; any without);
# fails when there is none.
first_failure() {
  local status node name
  while read -r status node name; do
    [[ "$status" != 0 && "$name" == "${1:-}"* ]] || continue
    printf '%s %s %s\n' "$status" "$node" "$name"
    return 0
  done < <(exit_records)
  return 1
}

# mimic_tmpdir [NODE]: the job-unique node-local folder used where the site
# provides no SLURM_TMPDIR: <base>/<user>/<job key>/<node>.
mimic_tmpdir() {
  local node=${1:-${SLURMD_NODENAME:-$(hostname -s)}}
  printf '%s/%s/%s/%s' "$HPC_TMPDIR_BASE" "${USER:-$(id -un)}" "$(job_key)" "$node"
}

# uses_mimic_tmpdir: decided once in the batch step (HPC_TMPDIR_MIMIC) from
# the site profile and whether SLURM_TMPDIR was set there.
uses_mimic_tmpdir() {
  [[ "${HPC_TMPDIR_MIMIC:-0}" == 1 ]]
}

# private_dir DIR: make sure DIR is a folder of this user's, not a symlink,
# with mode 0700, creating it (its parent must exist) when missing. Used for
# <base>/<user> and <base>/<user>/<job key> under a base folder other users
# share (/tmp), so nobody else can block, redirect or swap what a job stages.
# On a problem, prints it (one line) and fails; never follows a link.
private_dir() {
  local dir=$1 owner
  [[ -e "$dir" || -L "$dir" ]] || mkdir -m 0700 -- "$dir" 2>/dev/null || true
  if [[ -L "$dir" ]]; then
    printf '%s is a symlink; refusing to use it (remove it, or ask whoever made it)' "$dir"
    return 1
  fi
  if [[ ! -e "$dir" ]]; then
    printf 'cannot create %s (is its parent writable by you?)' "$dir"
    return 1
  fi
  if [[ ! -d "$dir" ]]; then
    printf '%s exists and is not a folder; refusing to use it' "$dir"
    return 1
  fi
  if [[ ! -O "$dir" ]]; then
    owner=$(stat -c %U -- "$dir" 2>/dev/null) || owner="someone else"
    printf '%s is owned by %s, not by %s; refusing to use it' "$dir" "$owner" "$(id -un)"
    return 1
  fi
  chmod 0700 -- "$dir" 2>/dev/null || {
    printf 'cannot make %s private (chmod 0700 failed)' "$dir"
    return 1
  }
}

# shared_base_ok BASE: BASE (the site's; a link to it is fine) does not let
# other users rename what is in it: not group/world writable, or sticky as
# /tmp is. Otherwise prints why (one line) and fails.
shared_base_ok() {
  local base=$1 mode
  mode=$(stat -L -c %a -- "$base" 2>/dev/null) || {
    printf 'cannot read the mode of %s' "$base"
    return 1
  }
  # %a prints 3 or 4 octal digits; the sticky bit is 1000.
  if ((8#$mode & 8#022)) && ! ((8#$mode & 8#1000)); then
    printf '%s is writable by other users without the sticky bit (mode %s), so they could swap the folders in it; ask the admins to chmod +t it, or pick another tmpdir_base' "$base" "$mode"
    return 1
  fi
}

# first_node: MASTER_ADDR for rendezvous, the first host of the allocation.
first_node() {
  local nodes
  # One host needs no expanding (a one-node job: most of them).
  if [[ -n "${SLURM_JOB_NODELIST:-}" && "$SLURM_JOB_NODELIST" != *[,[]* ]]; then
    printf '%s' "$SLURM_JOB_NODELIST"
    return 0
  fi
  nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null) || nodes=""
  if [[ -z "$nodes" ]]; then
    printf '%s' "${SLURMD_NODENAME:-$(hostname -s)}"
  else
    printf '%s' "${nodes%%$'\n'*}"
  fi
}

# master_port: derived from the job id (unique per array task, kept across
# requeues) in 15000-28999, so two jobs sharing a node do not collide; below
# Linux's ephemeral range (32768-60999, where any outgoing connection may take
# the port) and torch's default 29500. The job id counts the ports of that
# range that common services do not listen on (MASTER_PORT_AVOID, ascending),
# so consecutive jobs get distinct ports. MASTER_PORT in the environment wins
# (batch.sh). hpc_harness/dist.py's srun_port follows this rule for scripts
# not ours; a test holds its copy of the list equal to this one.
MASTER_PORT_AVOID=(15672 16992 16993 16994 16995 17001 17002 17500 24007 24008 25565 27017 27018 27019 28015)
master_port() {
  local id port avoid
  id=$(to_decimal_node "${SLURM_JOB_ID:-0}")
  port=$((15000 + id % (14000 - ${#MASTER_PORT_AVOID[@]})))
  for avoid in "${MASTER_PORT_AVOID[@]}"; do
    ((port < avoid)) || port=$((port + 1))
  done
  printf '%s' "$port"
}

# to_decimal_node DIGITS: DIGITS without leading zeros (never octal).
to_decimal_node() {
  local digits=${1#"${1%%[!0]*}"}
  [[ "$digits" =~ ^[0-9]+$ ]] || digits=0
  printf '%s' "$digits"
}

# first_run_file: where the first job to run this trial of the submission
# folder wrote its job key (batch.sh claim_first_run; launch.sh reads it).
first_run_file() {
  printf '%s/runs/first.%s' "$HPC_SUBMISSION_DIR" "$(trial_index)"
}

# trial_command_line: line K+1 of commands.txt (K = array task id).
trial_command_line() {
  local index line
  index=$(trial_index)
  line=$(sed -n "$((index + 1))p" "$HPC_SUBMISSION_DIR/commands.txt")
  [[ -n "$line" ]] || {
    hpc_error "commands.txt has no line for trial $index"
    return 1
  }
  printf '%s' "$line"
}

# signals_reach_task_only: does SLURM signal only this step's task processes,
# not their children? proctrack/cgroup does (SIGKILL aside), and puts each
# step in a cgroup of its own: .../job_<id>/step_<id> in the v1 freezer
# hierarchy, or under the unified one (v2). proctrack/linuxproc and pgid
# signal every process of the step.
signals_reach_task_only() {
  grep -qE '^([0-9]+:freezer|0:):.*/job_[0-9]+/step_[^/]+' /proc/self/cgroup 2>/dev/null
}

# load_runtime: defines runtime_exec for the venv or the container.
load_runtime() {
  # shellcheck source=/dev/null # chosen at submission: runtime_venv.sh or runtime_singularity.sh
  source "$HPC_SUBMISSION_DIR/node/runtime_${HPC_RUNTIME:-venv}.sh"
}
