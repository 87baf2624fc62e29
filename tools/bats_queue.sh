#!/usr/bin/env bash
# Runs bats test files from a queue that several runners share, each against
# the cluster its environment names (SLURM_CONF, HPC_CLUSTER_DIR): make test
# runs the integration suite so on both local clusters, and the runner whose
# other suite ends first takes over the files left. The split follows the
# machine's load, not a list. Slow files go first (ORDER_FILE), so the last
# ones taken are short and the runners end close together.
#
# Usage: tools/bats_queue.sh init QUEUE ORDER_FILE FILE...
#          writes QUEUE: the FILEs that ORDER_FILE names (one base name a
#          line, '#' comments), in its order, then the others in theirs
#        tools/bats_queue.sh run QUEUE NAME
#          takes files from QUEUE one at a time and runs each with
#          'bats --timing' until none is left; prints each file's output
#          under a '# NAME: FILE' line and fails if a file failed
set -euo pipefail

die() {
  echo "bats_queue.sh: error: $*" >&2
  exit 2
}

# queue_init QUEUE ORDER_FILE FILE...
queue_init() {
  local queue=$1 order=$2 file name
  shift 2
  local -A given=()
  for file in "$@"; do
    given[${file##*/}]=$file
  done
  : >"$queue" || die "cannot write $queue"
  while read -r name _; do
    [[ -n "$name" && "$name" != \#* ]] || continue
    [[ -n "${given[$name]:-}" ]] || die "$order names $name, which is not among the files given"
    printf '%s\n' "${given[$name]}" >>"$queue"
    unset "given[$name]"
  done <"$order"
  for file in "$@"; do
    [[ -z "${given[${file##*/}]:-}" ]] || printf '%s\n' "$file" >>"$queue"
  done
}

# queue_take QUEUE: prints the next file and removes it from QUEUE; fails
# when none is left. The lock makes a take whole against the other runners.
queue_take() {
  local queue=$1 next
  {
    flock 9
    next=$(head -n 1 "$queue")
    [[ -n "$next" ]] || return 1
    sed -i 1d "$queue"
  } 9>"$queue.lock"
  printf '%s\n' "$next"
}

# queue_run QUEUE NAME
queue_run() {
  local queue=$1 name=$2 file status=0 start
  while file=$(queue_take "$queue"); do
    echo "# $name: $file"
    start=$SECONDS
    bats --timing "$file" || status=1
    echo "# $name: $file took $((SECONDS - start)) s"
  done
  return "$status"
}

case "${1:-}" in
  init)
    (($# >= 4)) || die "usage: bats_queue.sh init QUEUE ORDER_FILE FILE..."
    shift
    queue_init "$@"
    ;;
  run)
    (($# == 3)) || die "usage: bats_queue.sh run QUEUE NAME"
    shift
    queue_run "$@"
    ;;
  *) die "usage: bats_queue.sh init QUEUE ORDER_FILE FILE... | run QUEUE NAME" ;;
esac
