#!/usr/bin/env bash
# Removes, on this node, what this user's finished jobs left behind of their
# job-unique local folders <base>/<user>/<job key>/<node> (mimic_tmpdir in
# hpc_files/node/lib.sh): a job killed before its keeper could clean up leaves
# one. A folder whose job id is still in `squeue -u $USER` is kept.
# Run on every node by submit_plai_cleanup (one small job per node), or by hand
# on one node. See --help.
#
# Usage: plai_cleanups/cleanup_node.sh [--base DIR | --site NAME] [--node NAME] [--dry-run]
set -euo pipefail
shopt -s nullglob dotglob

HPC_PROG=cleanup_node.sh
PLAI_CLEANUPS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HPC_FILES_DIR="$(cd "$PLAI_CLEANUPS_DIR/.." && pwd)/hpc_files"
# shellcheck source=../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../hpc_files/lib/site.sh
source "$HPC_FILES_DIR/lib/site.sh"
# shellcheck source=lib.sh
source "$PLAI_CLEANUPS_DIR/lib.sh"

opt_base=""
opt_base_given=0
opt_site_name=""
opt_node=""
opt_dry_run=0

print_help() {
  cat <<EOF
Usage: cleanup_node.sh [options]

Removes, on this node, the leftover folders <base>/<user>/<job key>/<node> of
this user's jobs that are no longer in 'squeue -u <user>', then each
<base>/<user>/<job key> folder that is left empty. Prints one line per folder
removed or kept, with the reason. Only <base>/<user>/ is read (user:
\${USER:-\$(id -un)}); symlinks are never followed.

Options:
  --base DIR     the node-local base folder (default: tmpdir_base of the site
                 profile, with \$USER expanded)
  --site NAME    site profile giving the base (default: \$HPC_SITE, else
                 $CLEANUP_DEFAULT_SITE: hpc_files/sites/NAME.conf or a file)
  --node NAME    this node's name, the subfolder to remove under each job key
                 (default: \$SLURMD_NODENAME, else 'hostname -s')
  --dry-run      list what would be removed; remove nothing
  -h, --help     show this help

Safety: only names of the form 123 or 123_4 directly under <base>/<user>/ are
considered; a job key is kept while its job id (the array job id for 123_4)
is in squeue; symlinks and files are reported and left alone; removal is
'rm -rf --one-file-system' on the exact path. If squeue fails, nothing is
removed. Exit status: 0 done, 1 a removal or squeue failed, 2 usage error.
EOF
}

# need_value OPTION ARGC: an option's value is missing.
need_value() {
  (($2 >= 2)) || usage_error "$1 expects a value"
}

parse_options() {
  while (($#)); do
    case "$1" in
      --base) need_value "$1" "$#"; opt_base=$2; opt_base_given=1; shift ;;
      --base=*) opt_base=${1#*=}; opt_base_given=1 ;;
      --site) need_value "$1" "$#"; opt_site_name=$2; shift ;;
      --site=*) opt_site_name=${1#*=} ;;
      --node) need_value "$1" "$#"; opt_node=$2; shift ;;
      --node=*) opt_node=${1#*=} ;;
      --dry-run) opt_dry_run=1 ;;
      -h | --help) print_help; exit 0 ;;
      --) shift; (($# == 0)) || usage_error "unexpected argument '$1' (this command takes options only)"; break ;;
      -*) usage_error "unknown option '$1' (see --help)" ;;
      *) usage_error "unexpected argument '$1' (this command takes options only)" ;;
    esac
    shift
  done
}

# One line per folder: '<node>: <verb> <path> (<reason>)'.
say() {
  local verb=$1 path=$2 reason=$3
  printf '%s: %s %s (%s)\n' "$node" "$verb" "${path//$'\n'/\\n}" "$reason"
}

removed_count=0
kept_count=0
failed_count=0

kept() {
  say kept "$1" "$2"
  kept_count=$((kept_count + 1))
}

# remove PATH REASON: rm -rf the exact folder (or say what would go).
remove() {
  local path=$1 reason=$2
  if ((opt_dry_run)); then
    say "would remove" "$path" "$reason"
    removed_count=$((removed_count + 1))
  elif rm -rf --one-file-system -- "${path:?}"; then
    say removed "$path" "$reason"
    removed_count=$((removed_count + 1))
  else
    say "failed to remove" "$path" "rm -rf exited non-zero; $reason"
    failed_count=$((failed_count + 1))
  fi
}

# live_ids: fill the live_ids set with the job ids (array job ids for array
# tasks, het job ids for components) of every job squeue lists for the user.
declare -A live_ids=()
read_live_ids() {
  local out line id
  # Every state: a job squeue would not list is taken for finished.
  out=$(without_env SQUEUE_ squeue -u "$user" -h -t all -o %i) || die "squeue -u $user failed; removing nothing"
  while IFS= read -r line; do
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line%"${line##*[![:space:]]}"}"
    [[ -n "$line" ]] || continue
    id=${line%%[!0-9]*}
    [[ -n "$id" ]] || die "unexpected line in squeue output: '$line'; removing nothing"
    live_ids[$id]=1
  done <<<"$out"
}

# live_id_list: the live job ids, sorted, on one line; 'none' if none.
live_id_list() {
  local ids=""
  ((${#live_ids[@]})) && ids=$(printf '%s\n' "${!live_ids[@]}" | sort -n | tr '\n' ' ')
  ids=${ids% }
  printf '%s' "${ids:-none}"
}

# clean_key KEY_DIR ID: the job is gone. Remove its folder for this node,
# then the key folder if nothing else is in it.
clean_key() {
  local key_dir=$1 id=$2 target rest=() name
  [[ "${key_dir%/*}" == "$user_dir" ]] || die "internal: $key_dir is not directly under $user_dir"
  target="$key_dir/$node"
  if [[ -L "$target" ]]; then
    kept "$target" "a symlink; not followed"
  elif [[ -e "$target" && ! -d "$target" ]]; then
    kept "$target" "not a folder"
  elif [[ -d "$target" ]]; then
    remove "$target" "job $id is not in squeue"
  fi
  for name in "$key_dir"/*; do
    # In a dry run the node folder counts as gone if it would be removed.
    [[ $opt_dry_run == 1 && "$name" == "$target" && -d "$target" && ! -L "$target" ]] && continue
    rest+=("${name##*/}")
  done
  if ((${#rest[@]})); then
    kept "$key_dir" "job $id is not in squeue, but the folder holds $(printf '%s ' "${rest[@]}" | sed 's/ $//')"
  elif ((opt_dry_run)); then
    say "would remove" "$key_dir" "job $id is not in squeue; empty"
    removed_count=$((removed_count + 1))
  elif rmdir -- "${key_dir:?}" 2>/dev/null; then
    say removed "$key_dir" "job $id is not in squeue; empty"
    removed_count=$((removed_count + 1))
  elif [[ -e "$key_dir" || -L "$key_dir" ]]; then
    # Another node sharing this disk put something there meanwhile.
    kept "$key_dir" "job $id is not in squeue, but the folder is not empty"
  fi
  # Otherwise another node sharing this disk removed it first.
}

main() {
  local base entry name id entries
  parse_options "$@"
  base=$(cleanup_base "$opt_base_given" "$opt_base" "$opt_site_name") || exit
  user=$(cleanup_user)
  [[ -n "$user" && "$user" != */* && "$user" != . && "$user" != .. ]] || die "cannot tell the user name (USER='${USER:-}')"
  node=${opt_node:-${SLURMD_NODENAME:-$(hostname -s)}}
  [[ "$node" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] ||
    usage_error "--node expects a node name (letters, digits, '.', '_', '-'), got '$node'"
  user_dir="${base:?}/${user:?}"
  if [[ -L "$user_dir" ]]; then
    die "$user_dir is a symlink; refusing to clean through it"
  elif [[ ! -e "$user_dir" ]]; then
    printf '%s: nothing to clean: %s does not exist\n' "$node" "$user_dir"
    return 0
  fi
  [[ -d "$user_dir" ]] || die "$user_dir is not a folder"
  [[ -O "$user_dir" ]] || die "$user_dir is not owned by $user (uid $(id -u)); refusing to clean it"
  # List first, then ask squeue: a folder seen here belongs to a job that had
  # started, so if that job is still alive, squeue below lists it.
  entries=("$user_dir"/*)
  read_live_ids
  printf '%s: cleaning %s%s (job ids in squeue: %s)\n' "$node" "$user_dir" \
    "$( ((opt_dry_run)) && printf ', dry run')" "$(live_id_list)"
  for entry in ${entries[@]+"${entries[@]}"}; do
    name=${entry##*/}
    if [[ ! "$name" =~ $CLEANUP_KEY_REGEX ]]; then
      kept "$entry" "not a job key"
    elif [[ -L "$entry" ]]; then
      kept "$entry" "a symlink; not followed"
    elif [[ ! -e "$entry" ]]; then
      continue # another node sharing this disk removed it meanwhile
    elif [[ ! -d "$entry" ]]; then
      kept "$entry" "not a folder"
    else
      id=${name%%_*}
      if [[ -n "${live_ids[$id]:-}" ]]; then
        kept "$entry" "job $id is in squeue"
      else
        clean_key "$entry" "$id"
      fi
    fi
  done
  if ((opt_dry_run)); then
    printf '%s: dry run: %d would be removed, %d kept\n' "$node" "$removed_count" "$kept_count"
  else
    printf '%s: %d removed, %d kept, %d failed\n' "$node" "$removed_count" "$kept_count" "$failed_count"
  fi
  ((failed_count == 0)) || exit 1
}

main "$@"
