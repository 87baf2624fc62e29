# shellcheck shell=bash
# Data staging, submit side (-d): the paths, relative to $SCRATCH/<project>,
# become ONE tarball in a cache folder on scratch, named by a digest of the
# sorted path list (plan_data in plan.sh) and one of their manifest (every
# file's path, size and mtime, symbolic links followed; name_data_tarball). Named by its contents, a
# tarball never changes once built: a job queued, requeued or sbatched again
# stages the data it was submitted with, whatever later submissions build.
# Built under a lock to a temporary name and renamed only when tar succeeded,
# so a killed or failed tar never leaves a trusted tarball. Beside it:
# NAME.manifest and NAME.meta (size of the tarball and of its contents, which
# the nodes check before extracting; read with meta_value, node/shared.sh).
# Sourced; functions only.

# validate_data_paths: every -d path is relative, has no '..' and exists (the
# -e test follows symbolic links), with no broken link inside; the first path
# (in order) with a problem is named.
# A link may lead outside the project's scratch folder: clusters keep shared,
# read-only datasets elsewhere (datasets/imagenet -> /datashare/imagenet), and
# the tarball holds what links lead to; nothing behind them is written.
validate_data_paths() {
  local path problem
  ((${#opt_data[@]} > 0)) || return 0
  [[ -d "$plan_scratch_dir" ]] ||
    usage_error "--data paths are relative to $plan_scratch_dir, which does not exist"
  for path in "${opt_data[@]}"; do
    problem=$(data_path_problem "$path")
    [[ -z "$problem" ]] || usage_error "$problem"
    problem=$(data_links_problem "$path")
    [[ -z "$problem" ]] || usage_error "$problem"
  done
}

# validate_experiment_folder: -e names the folder the runs write their
# checkpoints into ($SCRATCH/<project>/<exp>): not a -d data folder, and not
# a folder of other files (an experiment's has checkpoints/ from its first
# submission on).
validate_experiment_folder() {
  local path first
  for path in ${opt_data[@]+"${opt_data[@]}"}; do
    first=${path#./}
    first=${first%%/*}
    [[ "$first" != "$opt_exp_name" ]] ||
      usage_error "--exp-name '$opt_exp_name' is the folder of --data path '$path': the runs would write their checkpoints among the data; choose another -e"
  done
  [[ ! -e "$plan_exp_dir" || -d "$plan_exp_dir/checkpoints" ]] && return 0
  [[ -d "$plan_exp_dir" && -z "$(ls -A -- "$plan_exp_dir")" ]] && return 0
  usage_error "--exp-name '$opt_exp_name' names $plan_exp_dir, which holds other files than an experiment's (no checkpoints/ folder); choose another -e"
}

# data_links_problem PATH: a broken symbolic link or a link loop under the
# -d path PATH, in words (nothing when none): the tarball holds what links lead to
# (data_manifest), and neither leads to anything it could hold.
data_links_problem() {
  local found message=""
  found=$(cd "$plan_scratch_dir" && LC_ALL=C find -L "$1" -type l -print -quit 2>&1) || true
  found=${found%%$'\n'*}
  if [[ "$found" == "find: "* ]]; then
    message="--data path '$1': ${found#find: } (the tarball holds what links lead to): remove the link"
  elif [[ -n "$found" ]]; then
    message="--data path '$1' holds a broken symbolic link '$found' (the tarball holds what links lead to): remove or repair it"
  fi
  printf '%s' "$message"
}

# data_path_problem PATH: what is wrong with one -d path, as far as that
# shows without running a process (nothing when nothing is).
data_path_problem() {
  local path=$1 message=""
  if [[ -z "$path" ]]; then
    message="--data expects a path, got ''"
  elif [[ "$path" == /* ]]; then
    message="--data paths are relative to \$SCRATCH/$project_name, got the absolute path '$path'"
  elif [[ "$path" == *$'\n'* || "$path" == *$'\t'* ]]; then
    message="--data paths must not contain newlines or tabs"
  elif [[ "/$path/" == */../* ]]; then
    message="--data path '$path' must not contain '..'"
  elif [[ "$path" == -* ]]; then
    message="--data path '$path' must not start with '-'"
  elif [[ ! -e "$plan_scratch_dir/$path" ]]; then
    message="--data path '$path' does not exist in $plan_scratch_dir"
  fi
  printf '%s' "$message"
}

# data_manifest: one line per file or folder: path, size, mtime (sorted).
# Symbolic links are followed (find -L), as tar follows them (--dereference):
# the tarball holds the files a -d path leads to, so a job never reads data
# behind a link on scratch that changed after its submission.
data_manifest() {
  (cd "$plan_scratch_dir" && find -L "${plan_data_paths[@]}" -printf '%p\t%s\t%T@\t%y\n' | LC_ALL=C sort)
}

# data_manifest_digest: the sha256 of data_manifest's output, the paths as
# they are now. The manifest streams from find into sha256sum and is never
# held in a variable: bash takes ~1 s per million files to copy strings that
# large. Status 1 when the paths cannot be listed.
data_manifest_digest() {
  local sum
  sum=$(data_manifest | sha256sum) || return 1
  printf '%s' "${sum%% *}"
}

# start_data_digest: data_manifest_digest into $work_dir/data.digest, in the
# background (start_background) from the checks on: find, sort and sha256sum
# then run beside the questions to SLURM. name_data_tarball reads it.
start_data_digest() {
  ((${#plan_data_paths[@]} > 0)) || return 0
  make_work_dir
  start_background data_digest write_data_digest "$work_dir/data.digest"
}

# write_data_digest FILE: data_manifest_digest into FILE.
write_data_digest() {
  data_manifest_digest >"$1"
}

# name_data_tarball: plan_data_tarball, the cached tarball of the -d paths as
# they are now: data-<paths digest>-<manifest digest>.tar[.zst|.gz]. The
# digest is start_data_digest's, or taken now where none was started.
name_data_tarball() {
  local digest="" name
  plan_data_tarball=""
  ((${#plan_data_paths[@]} > 0)) || return 0
  # The file ends without a newline: read fails at its end, digest read whole.
  ! await data_digest || read -r digest <"$work_dir/data.digest" || true
  [[ -n "$digest" ]] || digest=$(data_manifest_digest) || die "cannot list the --data paths in $plan_scratch_dir"
  name=$(data_tarball_name "$plan_data_paths_digest-${digest:0:16}" "$plan_compress")
  plan_data_tarball="$plan_data_cache/$name"
}

# stage_data_tarball: name the tarball (name_data_tarball), and build it
# unless it is in the cache already. Prints what it did on stderr.
stage_data_tarball() {
  local lock_fd tmp_tar tmp_manifest tar_status bytes digest earlier
  local -a tar_args=()
  name_data_tarball
  [[ -n "$plan_data_tarball" ]] || return 0
  [[ -d "$plan_data_cache" ]] || mkdir -p "$plan_data_cache" || die "cannot create $plan_data_cache"
  if data_tarball_complete; then
    info "data: reusing ${plan_data_tarball##*/} (manifest unchanged)"
    return 0
  fi
  # One builder at a time per tarball; the others wait, then find it built.
  exec {lock_fd}>"$plan_data_tarball.lock" || die "cannot open $plan_data_tarball.lock"
  flock -w 3600 "$lock_fd" || die "timed out waiting for another submission building ${plan_data_tarball##*/}"
  if data_tarball_complete; then
    exec {lock_fd}>&-
    info "data: reusing ${plan_data_tarball##*/} (built by a concurrent submission)"
    return 0
  fi
  earlier=$(data_earlier_tarballs)
  info "data: building ${plan_data_tarball##*/} from ${#plan_data_paths[@]} path(s)${earlier:+; $earlier} ..."
  tmp_tar=$(mktemp "$plan_data_tarball.tmp.XXXXXX") || die "mktemp failed in $plan_data_cache"
  tmp_manifest=$(mktemp "$plan_data_tarball.manifest.XXXXXX") || die "mktemp failed in $plan_data_cache"
  register_cleanup "$tmp_tar"
  register_cleanup "$tmp_manifest"
  # The manifest is taken before tar: a file changed while tar reads it
  # makes the next submission build another tarball.
  data_manifest >"$tmp_manifest" || die "cannot list the --data paths in $plan_scratch_dir"
  digest=$(sha256sum <"$tmp_manifest")
  [[ "${plan_data_tarball##*/}" == "data-$plan_data_paths_digest-${digest:0:16}."* ]] ||
    die "the --data paths changed while this submission named their tarball; submit again"
  bytes=$(awk -F '\t' '{ total += $2 } END { printf "%d", total }' "$tmp_manifest")
  if [[ -t 2 ]]; then
    # On a terminal: what tar has written so far, every 10 MiB or so.
    tar_args=(--checkpoint=1000 "--checkpoint-action=ttyout=$HPC_PROG: data: %T of $((bytes / 1048576)) MiB\r")
  fi
  [[ "$plan_compress" == none ]] || tar_args+=(--use-compress-program="$plan_compress")
  tar_status=0
  tar -C "$plan_scratch_dir" --dereference ${tar_args[@]+"${tar_args[@]}"} -cf "$tmp_tar" -- "${plan_data_paths[@]}" || tar_status=$?
  [[ ! -t 2 ]] || printf '\r\033[K' >&2
  ((tar_status == 0)) || die "tar failed (exit $tar_status) building the data tarball; nothing was submitted"
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tmp_tar")" "$bytes" >"$plan_data_tarball.meta.tmp" ||
    die "cannot write $plan_data_tarball.meta"
  # Tarball first, meta last: a meta file only ever describes a complete tarball.
  mv -f "$tmp_tar" "$plan_data_tarball" || die "cannot move the data tarball into $plan_data_cache"
  mv -f "$tmp_manifest" "$plan_data_tarball.manifest" || die "cannot write $plan_data_tarball.manifest"
  mv -f "$plan_data_tarball.meta.tmp" "$plan_data_tarball.meta" || die "cannot write $plan_data_tarball.meta"
  exec {lock_fd}>&-
  info "data: built ${plan_data_tarball##*/} ($(stat -c %s "$plan_data_tarball") bytes)"
}

# data_earlier_tarballs: how many tarballs of the same -d paths with other
# contents the cache holds and their size, or nothing when none. They stay:
# submission folders that name them may run again.
data_earlier_tarballs() {
  local pattern tarball count=0 bytes=0
  pattern=$(data_tarball_name "$plan_data_paths_digest-*" "$plan_compress")
  # shellcheck disable=SC2086 # a glob (no spaces): every tarball of these paths
  for tarball in "$plan_data_cache"/$pattern; do
    [[ -f "$tarball" && "$tarball" != "$plan_data_tarball" ]] || continue
    count=$((count + 1))
    bytes=$((bytes + $(stat -c %s "$tarball")))
  done
  ((count == 0)) ||
    printf '%s earlier tarball(s) of these paths (%s MiB) stay for the submissions that name them (--prune-data-cache removes those none names)' \
      "$count" "$((bytes / 1048576))"
}

# data_tarball_complete: the cached tarball exists and is as large as its
# meta file says it was built.
data_tarball_complete() {
  local size recorded
  [[ -f "$plan_data_tarball" && -f "$plan_data_tarball.meta" ]] || return 1
  size=$(stat -c %s "$plan_data_tarball")
  recorded=$(meta_value "$plan_data_tarball.meta" tarball_bytes) || return 1
  [[ "$size" == "$recorded" ]]
}

# prune_data_cache: --prune-data-cache. Removes the cached tarballs (and
# their manifest, meta and lock files) that no submission folder's job.sbatch
# names; a tarball being built or waited for (its lock held) stays.
prune_data_cache() {
  local cache=$plan_data_cache line tarball name pattern compress lock_fd bytes freed=0 removed=0 kept=0
  local -A named=()
  if [[ ! -d "$cache" ]]; then
    info "data cache: $cache does not exist; nothing to prune"
    return 0
  fi
  # export HPC_DATA_TARBALL=PATH, PATH maybe quoted: its last component.
  while IFS= read -r line; do
    line=${line%\'}
    named[${line##*/}]=1
  done < <(grep -h '^export HPC_DATA_TARBALL=' "$plan_scratch_dir"/*/*/job.sbatch 2>/dev/null)
  for compress in none zstd pigz; do
    pattern=$(data_tarball_name '*' "$compress")
    # shellcheck disable=SC2086 # a glob (no spaces): every tarball of this compression
    for tarball in "$cache"/$pattern; do
      [[ -f "$tarball" ]] || continue
      name=${tarball##*/}
      if [[ -n "${named[$name]:-}" ]]; then
        kept=$((kept + 1))
        continue
      fi
      exec {lock_fd}>"$tarball.lock" || die "cannot open $tarball.lock"
      if ! flock -n "$lock_fd"; then
        exec {lock_fd}>&-
        info "data cache: keeping $name (a submission is building or reading it)"
        kept=$((kept + 1))
        continue
      fi
      bytes=$(stat -c %s "$tarball")
      rm -f -- "$tarball" "$tarball.manifest" "$tarball.meta" "$tarball.lock" || die "cannot remove $tarball"
      exec {lock_fd}>&-
      freed=$((freed + bytes))
      removed=$((removed + 1))
      info "data cache: removed $name ($bytes bytes)"
    done
  done
  info "data cache: removed $removed tarball(s), $((freed / 1048576)) MiB; kept $kept named by a submission folder or in use"
}
