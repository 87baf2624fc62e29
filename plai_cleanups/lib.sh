# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034/SC2154: CLEANUP_KEY_REGEX is read by cleanup_node.sh; site_file,
# site_tmpdir_base and site_partition are set by hpc_files/lib/site.sh, which
# the scripts source beside this file.)
# Shared by submit_plai_cleanup and cleanup_node.sh: which base folder to clean
# and what counts as a job key. Sourced after hpc_files/lib/common.sh
# (usage_error, die) and hpc_files/lib/site.sh (read_site_file); functions only.

CLEANUP_DEFAULT_SITE=plai

# A job key as job_key (hpc_files/node/lib.sh) writes it: '123' or '123_4'.
# Stricter than any digits: a leading zero is never written by SLURM, so such
# a name is not ours and is kept.
CLEANUP_KEY_REGEX='^[1-9][0-9]*(_(0|[1-9][0-9]*))?$'

# cleanup_user: whose folders are cleaned, as mimic_tmpdir names them.
cleanup_user() {
  printf '%s' "${USER:-$(id -un)}"
}

# cleanup_base GIVEN BASE SITE: the base folder to clean. BASE when GIVEN is
# 1, else tmpdir_base of the site profile SITE (or HPC_SITE, or plai) with
# $USER expanded as the job's batch script would. Checked by check_base.
cleanup_base() {
  local given=$1 base=$2 user
  if [[ "$given" != 1 ]]; then
    cleanup_read_site "$3"
    base=$site_tmpdir_base
    user=$(cleanup_user)
    # shellcheck disable=SC2016 # the literal text $USER / ${USER} is replaced
    base=${base//'${USER}'/$user}
    # shellcheck disable=SC2016 # as above
    base=${base//'$USER'/$user}
    [[ "$base" != *'$'* && "$base" != *'`'* ]] ||
      usage_error "site profile $site_file: tmpdir_base '$site_tmpdir_base' names a variable other than \$USER; pass --base DIR"
  fi
  check_base "$base"
}

# cleanup_site_partition SITE: the partition key of the site profile SITE
# (or HPC_SITE, or plai); '' if it names none.
cleanup_site_partition() {
  cleanup_read_site "$1"
  printf '%s' "$site_partition"
}

# cleanup_read_site SITE: read the site profile SITE (or HPC_SITE, or plai)
# into site_* variables.
cleanup_read_site() {
  find_site_file "${1:-${HPC_SITE:-$CLEANUP_DEFAULT_SITE}}"
  read_site_file "$site_file"
}

# check_base DIR: print DIR without trailing slashes, or stop with a usage
# error if it is empty, relative, the root, or has '..', newlines or globs.
check_base() {
  local base=$1
  [[ -n "$base" ]] || usage_error "--base expects a folder, got '' (refusing an empty base)"
  [[ "$base" == /* ]] || usage_error "--base expects an absolute path, got '$base'"
  [[ "$base" != *$'\n'* ]] || usage_error "--base must not contain a newline"
  [[ "/$base/" != */../* && "/$base/" != */./* ]] || usage_error "--base must not contain '.' or '..' components, got '$base'"
  [[ "$base" != *[\*\?\[]* ]] || usage_error "--base must not contain glob characters (* ? [), got '$base'"
  while [[ "$base" == */ ]]; do
    base=${base%/}
  done
  [[ -n "$base" ]] || usage_error "--base must not be the root folder '/'"
  printf '%s' "$base"
}

# without_env PREFIX COMMAND [ARG...]: run COMMAND with every exported
# variable whose name starts with PREFIX removed. squeue and sinfo read
# SQUEUE_STATES, SQUEUE_PARTITION, SINFO_PARTITION, ... from the environment
# (inherited by the job through --export=ALL); any of them could hide live
# jobs or nodes from the cleanup.
without_env() {
  local prefix=$1 name
  shift
  (
    while IFS= read -r name; do
      unset "$name"
    done < <(compgen -e "$prefix")
    "$@"
  )
}
