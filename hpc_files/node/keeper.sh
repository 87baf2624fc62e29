#!/usr/bin/env bash
# One task per node for the whole job (srun --overlap, started by batch.sh):
#  1. where the site has no SLURM_TMPDIR, creates the job-unique folder
#     <base>/<user>/<job key>/<node>;
#  2. extracts the data tarball into SLURM_TMPDIR once per node, after checking
#     that the tarball is complete and that the disk has room;
#  3. reports '<node>.ok' or '<node>.failed' (with the reason) in the run folder;
#  4. if it created the folder or --stage-out is set, stays until the job ends,
#     then copies the stage-out folder back and removes the folder. The end is
#     told three ways: batch.sh writes <stage dir>/stop (read every second: a
#     signal through srun reaches only the tasks srun has seen start, so it
#     can be lost) and sends USR2 (at once), once the program has ended.
#     SLURM sends TERM to every task at once on cancel, preemption and
#     requeue: the program's grace time has begun, and it may still read and
#     write the folder. So at TERM the keeper waits for batch.sh's word as
#     before, but at most until shortly before SLURM's SIGKILL (the grace
#     time: the larger of KillWait and the partition's GraceTime). A SIGKILL
#     may leave a large folder half removed: plai_cleanups/ removes the rest.
# It never removes anything but the exact folder it created.
set -euo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

node=${SLURMD_NODENAME:-$(hostname -s)}
status_dir=$(stage_dir)
created_dir=""
local_dir=""
sleep_pid=""
terminating=""
# Seconds before SLURM's SIGKILL that the stage-out and removal may take.
readonly KILL_MARGIN=3

report() {
  local outcome=$1 message=${2:-}
  printf '%s\n' "$message" >"$status_dir/.$node.$outcome.tmp"
  mv -f "$status_dir/.$node.$outcome.tmp" "$status_dir/$node.$outcome"
}

fail() {
  hpc_error "$node: $*"
  report failed "$*"
  finish 1
}

stage_out() {
  local target
  [[ -n "${HPC_STAGE_OUT:-}" && -n "$local_dir" && -d "$local_dir/$HPC_STAGE_OUT" ]] || return 0
  # Per result folder (array task K: its trial folder), and per node when
  # several nodes may each have written one.
  target="${HPC_TRIAL_DIR:?}/$HPC_STAGE_OUT"
  ((${SLURM_JOB_NUM_NODES:-1} == 1)) || target+="/$node"
  if mkdir -p "$target" && cp -a "$local_dir/$HPC_STAGE_OUT/." "$target/"; then
    hpc_log "$node: staged out $HPC_STAGE_OUT to $target"
  else
    hpc_error "$node: stage-out of $HPC_STAGE_OUT to $target failed"
  fi
}

# finish [STATUS]: stage out, remove the folder this keeper created, exit.
# shellcheck disable=SC2317 # called from traps
finish() {
  local status=${1:-0}
  # Ignored, not reset: a second signal (USR2 then TERM at a cancel) must not
  # end the shell halfway through the stage-out or the removal.
  trap - EXIT
  trap '' TERM INT USR2 HUP
  [[ -z "$sleep_pid" ]] || kill "$sleep_pid" 2>/dev/null || true
  stage_out
  if [[ -n "$created_dir" && -d "$created_dir" && ! -L "$created_dir" ]]; then
    rm -rf -- "${created_dir:?}"
    # The job-key folder, if no other node of this job shares the disk.
    rmdir -- "${created_dir%/*}" 2>/dev/null || true
    hpc_log "$node: removed $created_dir"
  fi
  exit "$status"
}

# shellcheck disable=SC2317 # called from a trap
on_term() {
  terminating=1
  [[ -z "$sleep_pid" ]] || kill "$sleep_pid" 2>/dev/null || true
}

# grace_seconds: how long SLURM lets a job's processes run after its TERM:
# KillWait, or the partition's GraceTime when it preempts; the larger, as the
# keeper cannot tell a preemption from a cancel. 30 when scontrol cannot say.
grace_seconds() {
  local config record kill_wait="" grace=""
  config=$(scontrol show config 2>/dev/null) || config=""
  [[ "$config" =~ KillWait[[:space:]]*=[[:space:]]*([0-9]+) ]] && kill_wait=${BASH_REMATCH[1]}
  record=$(scontrol show partition "${SLURM_JOB_PARTITION:-}" -o 2>/dev/null) || record=""
  grace=$(record_field "$record" GraceTime) || true
  [[ "$grace" =~ ^[0-9]+$ ]] || grace=0
  [[ -n "$kill_wait" ]] || kill_wait=30
  printf '%s' $((kill_wait > grace ? kill_wait : grace))
}

# wait_for_stop: until batch.sh says the program ended (the stop file, or
# USR2 through finish); after a TERM, at most until KILL_MARGIN seconds before
# SLURM's SIGKILL, so what the program wrote in its grace time is staged out.
wait_for_stop() {
  local deadline="" grace
  while [[ ! -e "$status_dir/stop" ]]; do
    if [[ -n "$terminating" && -z "$deadline" ]]; then
      grace=$(grace_seconds)
      deadline=$((SECONDS + (grace > KILL_MARGIN ? grace - KILL_MARGIN : 0)))
      hpc_log "$node: SIGTERM; waiting for the program to end (at most $((deadline - SECONDS)) s) before the stage-out and cleanup"
    fi
    if [[ -n "$deadline" ]] && ((SECONDS >= deadline)); then
      hpc_log "$node: the program still runs $grace s after SIGTERM, close to SLURM's SIGKILL; staging out and cleaning up now"
      return 0
    fi
    sleep 1 &
    sleep_pid=$!
    wait "$sleep_pid" 2>/dev/null || true
  done
}

prepare_local_dir() {
  if uses_mimic_tmpdir; then
    local_dir=$(mimic_tmpdir "$node")
    [[ "$local_dir" == /?*/?*/?*/?* ]] || fail "refusing the local folder '$local_dir' (HPC_TMPDIR_BASE='$HPC_TMPDIR_BASE')"
    # The base may be shared (/tmp): the site's to make. <base>/<user> and
    # <base>/<user>/<job key> must be this user's own, private, and no links.
    local problem
    mkdir -p -- "${local_dir%/*/*/*}" || fail "cannot create ${local_dir%/*/*/*}"
    problem=$(shared_base_ok "${local_dir%/*/*/*}") || fail "$problem"
    problem=$(private_dir "${local_dir%/*/*}") || fail "$problem"
    # Nodes of this job sharing the disk share <job key>, and one that ends
    # removes it once empty (finish): when it vanishes meanwhile, make it again.
    for _ in 1 2 3; do
      problem=$(private_dir "${local_dir%/*}") || {
        [[ ! -e "${local_dir%/*}" ]] || fail "$problem"
        continue
      }
      [[ ! -L "$local_dir" ]] || fail "$local_dir is a symlink; refusing to use it"
      if [[ -d "$local_dir" ]]; then
        # Left by an earlier run of this same job (a node failed before its
        # keeper could clean up, then the job was requeued): start afresh.
        hpc_log "$node: removing $local_dir left by an earlier run of this job"
        rm -rf -- "${local_dir:?}" || fail "cannot remove the stale $local_dir"
      fi
      mkdir -m 0700 "$local_dir" 2>/dev/null && break
      [[ ! -e "${local_dir%/*}" ]] || fail "cannot create $local_dir"
    done
    [[ -d "$local_dir" ]] || fail "${problem:-cannot create $local_dir}"
    created_dir=$local_dir
  else
    local_dir=${SLURM_TMPDIR:-}
    [[ -n "$local_dir" && -d "$local_dir" ]] || fail "SLURM_TMPDIR ('$local_dir') is not a folder on this node"
  fi
}

extract_data() {
  local tarball=${HPC_DATA_TARBALL:-} meta size recorded need free
  [[ -n "$tarball" ]] || return 0
  [[ -f "$tarball" ]] || fail "data tarball $tarball is missing"
  meta="$tarball.meta"
  [[ -f "$meta" ]] || fail "data tarball $tarball has no .meta file (it was never completed)"
  size=$(stat -c %s "$tarball")
  recorded=$(meta_value "$meta" tarball_bytes)
  [[ "$size" == "$recorded" ]] ||
    fail "data tarball $tarball is $size bytes but was built as $recorded bytes (truncated or replaced); resubmit to rebuild it"
  need=$(meta_value "$meta" content_bytes)
  free=$(df -Pk "$local_dir" | awk 'NR == 2 { printf "%d", $4 * 1024 }')
  ((need < free)) || fail "not enough space in $local_dir: the data needs $need bytes, $free bytes are free"
  local start=$SECONDS
  if [[ -n "${HPC_COMPRESS:-}" ]]; then
    tar -C "$local_dir" --use-compress-program="$HPC_COMPRESS" -xf "$tarball" || fail "extracting $tarball into $local_dir failed (tar exit $?)"
  else
    tar -C "$local_dir" -xf "$tarball" || fail "extracting $tarball into $local_dir failed (tar exit $?)"
  fi
  hpc_log "$node: staged ${tarball##*/} into $local_dir in $((SECONDS - start)) s"
}

main() {
  mkdir -p "$status_dir"
  trap 'finish 0' INT USR2 HUP
  trap on_term TERM
  trap 'report failed "keeper exited unexpectedly"' ERR
  prepare_local_dir
  extract_data
  trap - ERR
  report ok "$local_dir"
  if [[ -z "$created_dir" && -z "${HPC_STAGE_OUT:-}" ]]; then
    exit 0
  fi
  # Stay until told: the traps above, or the stop file.
  wait_for_stop
  finish 0
}

main "$@"
