# shellcheck shell=bash
# Data staging, submit side (-d): the paths, relative to $scratch_dir, become
# ONE tarball in a cache folder on scratch, named by a digest of the sorted
# path list. It is reused only while its manifest (every file's path, size and
# mtime) still matches, built under a lock to a temporary name and renamed only
# when tar succeeded, so a killed or failed tar never leaves a trusted tarball.
# Beside it: NAME.manifest and NAME.meta (size of the tarball and of its
# contents, which the nodes check before extracting; read with meta_value,
# node/shared.sh). Sourced; functions only.

# validate_data_paths: every -d path is relative, stays inside $scratch_dir
# (symbolic links followed) and exists; otherwise exits 2 naming the first
# path (in order) with a problem. Sets plan_data_paths (sorted, unique).
validate_data_paths() {
  local path problem real real_scratch
  plan_data_paths=()
  ((${#opt_data[@]} > 0)) || return 0
  real_scratch=$(cd "$scratch_dir" 2>/dev/null && pwd -P) ||
    usage_error "--data paths are relative to $scratch_dir, which does not exist"
  for path in "${opt_data[@]}"; do
    data_path_problem "$path" problem
    [[ -z "$problem" ]] || usage_error "$problem"
    real=$(realpath -e -- "$scratch_dir/$path" 2>/dev/null) || usage_error "--data path '$path' cannot be resolved"
    [[ "$real" == "$real_scratch" || "$real" == "$real_scratch"/* ]] ||
      usage_error "--data path '$path' resolves outside $scratch_dir (symlink to '$real')"
    path=${path%/}
    plan_data_paths+=("${path#./}")
  done
  mapfile -t plan_data_paths < <(printf '%s\n' "${plan_data_paths[@]}" | LC_ALL=C sort -u)
}

# data_path_problem PATH VAR: what is wrong with one -d path, as far as that
# shows without running a process, in VAR (empty when nothing is).
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
  elif [[ ! -e "$scratch_dir/$path" ]]; then
    message="--data path '$path' does not exist in $scratch_dir"
  fi
  printf -v "$2" '%s' "$message"
}

# plan_data: the tarball's name, a pure function of the path list and the
# compression, so the rendered script names it without building it.
plan_data() {
  local digest suffix=""
  plan_data_tarball=""
  ((${#plan_data_paths[@]} > 0)) || return 0
  digest=$(sha256sum < <(printf '%s\0' "${plan_data_paths[@]}"))
  digest=${digest:0:16}
  case "$opt_compress" in
    zstd) suffix=".zst" ;;
    pigz) suffix=".gz" ;;
  esac
  plan_data_cache="$scratch_dir/.hpc_data_cache"
  plan_data_tarball="$plan_data_cache/data-$digest.tar$suffix"
}

# data_manifest: one line per file or folder: path, size, mtime (sorted).
data_manifest() {
  (cd "$scratch_dir" && find "${plan_data_paths[@]}" -printf '%p\t%s\t%T@\t%y\n' | LC_ALL=C sort)
}

# stage_data_tarball: build or reuse the tarball. Prints what it did on stderr.
# The manifest streams from find into cmp and is never held in a variable:
# bash takes ~1 s per million files to copy and compare strings that large.
stage_data_tarball() {
  local status lock_fd tmp_tar tmp_manifest tar_status bytes
  local -a progress=()
  [[ -n "$plan_data_tarball" ]] || return 0
  [[ -d "$plan_data_cache" ]] || mkdir -p "$plan_data_cache" || die "cannot create $plan_data_cache"
  data_manifest | data_cache_matches && status=(0 0) || status=("${PIPESTATUS[@]}")
  ((status[0] == 0)) || die "cannot list the --data paths in $scratch_dir"
  if ((status[1] == 0)); then
    info "data: reusing ${plan_data_tarball##*/} (manifest unchanged)"
    return 0
  fi
  # One builder at a time per tarball; the others wait, then find it fresh.
  exec {lock_fd}>"$plan_data_tarball.lock" || die "cannot open $plan_data_tarball.lock"
  flock -w 3600 "$lock_fd" || die "timed out waiting for another submission building ${plan_data_tarball##*/}"
  data_manifest | data_cache_matches && status=(0 0) || status=("${PIPESTATUS[@]}")
  ((status[0] == 0)) || die "cannot list the --data paths in $scratch_dir"
  if ((status[1] == 0)); then
    exec {lock_fd}>&-
    info "data: reusing ${plan_data_tarball##*/} (built by a concurrent submission)"
    return 0
  fi
  info "data: building ${plan_data_tarball##*/} from ${#plan_data_paths[@]} path(s) ..."
  tmp_tar=$(mktemp "$plan_data_tarball.tmp.XXXXXX") || die "mktemp failed in $plan_data_cache"
  tmp_manifest=$(mktemp "$plan_data_tarball.manifest.XXXXXX") || die "mktemp failed in $plan_data_cache"
  register_cleanup "$tmp_tar"
  register_cleanup "$tmp_manifest"
  # The manifest is taken before tar: a file changed while tar reads it
  # makes the next submission rebuild.
  data_manifest >"$tmp_manifest" || die "cannot list the --data paths in $scratch_dir"
  bytes=$(awk -F '\t' '{ total += $2 } END { printf "%d", total }' "$tmp_manifest")
  if [[ -t 2 ]]; then
    # On a terminal: what tar has written so far, every 10 MiB or so.
    progress=(--checkpoint=1000 "--checkpoint-action=ttyout=$HPC_PROG: data: %T of $((bytes / 1048576)) MiB\r")
  fi
  tar_status=0
  case "$opt_compress" in
    none) tar -C "$scratch_dir" ${progress[@]+"${progress[@]}"} -cf "$tmp_tar" -- "${plan_data_paths[@]}" || tar_status=$? ;;
    *) tar -C "$scratch_dir" ${progress[@]+"${progress[@]}"} --use-compress-program="$opt_compress" -cf "$tmp_tar" -- "${plan_data_paths[@]}" || tar_status=$? ;;
  esac
  [[ ! -t 2 ]] || printf '\r\033[K' >&2
  ((tar_status == 0)) || die "tar failed (exit $tar_status) building the data tarball; nothing was submitted"
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tmp_tar")" "$bytes" >"$plan_data_tarball.meta.tmp" ||
    die "cannot write $plan_data_tarball.meta"
  # Tarball first, manifest last: a manifest only ever describes a complete tarball.
  mv -f "$tmp_tar" "$plan_data_tarball" || die "cannot move the data tarball into $plan_data_cache"
  mv -f "$plan_data_tarball.meta.tmp" "$plan_data_tarball.meta" || die "cannot write $plan_data_tarball.meta"
  mv -f "$tmp_manifest" "$plan_data_tarball.manifest" || die "cannot write $plan_data_tarball.manifest"
  exec {lock_fd}>&-
  info "data: built ${plan_data_tarball##*/} ($(stat -c %s "$plan_data_tarball") bytes)"
}

# data_cache_matches: the cached tarball is complete and its manifest is
# exactly the one on stdin (data_manifest's output). Reads stdin to the end
# either way, so the writer never meets a closed pipe.
data_cache_matches() {
  local size recorded
  if [[ ! -f "$plan_data_tarball" || ! -f "$plan_data_tarball.manifest" || ! -f "$plan_data_tarball.meta" ]] ||
    ! cmp -s - "$plan_data_tarball.manifest"; then
    cat >/dev/null
    return 1
  fi
  size=$(stat -c %s "$plan_data_tarball")
  recorded=$(meta_value "$plan_data_tarball.meta" tarball_bytes) || return 1
  [[ "$size" == "$recorded" ]]
}

# prune_data_cache: --prune-data-cache. Removes the cached tarballs (and
# their manifest, meta and lock files) that no submission folder's job.sbatch
# names; a tarball being built or waited for (its lock held) stays.
prune_data_cache() {
  local cache="$scratch_dir/.hpc_data_cache" line tarball name lock_fd bytes freed=0 removed=0 kept=0
  local -A named=()
  if [[ ! -d "$cache" ]]; then
    info "data cache: $cache does not exist; nothing to prune"
    return 0
  fi
  while IFS= read -r line; do
    [[ "$line" =~ (data-[0-9a-f]+\.tar(\.zst|\.gz)?) ]] && named[${BASH_REMATCH[1]}]=1
  done < <(grep -h '^export HPC_DATA_TARBALL=' "$scratch_dir"/*/*/job.sbatch 2>/dev/null)
  for tarball in "$cache"/data-*.tar "$cache"/data-*.tar.zst "$cache"/data-*.tar.gz; do
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
  info "data cache: removed $removed tarball(s), $((freed / 1048576)) MiB; kept $kept named by a submission folder or in use"
}
