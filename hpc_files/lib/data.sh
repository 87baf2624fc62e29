# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034/SC2154: the opt_*, site_* and plan_* variables are shared by the
# libraries that job_submitter.sh sources together; shellcheck -x on
# job_submitter.sh checks them as a whole.)
# Data staging, submit side (-d): the paths, relative to $scratch_dir, become
# ONE tarball in a cache folder on scratch, named by a digest of the sorted
# path list. It is reused only while its manifest (every file's path, size and
# mtime) still matches, built under a lock to a temporary name and renamed only
# when tar succeeded, so a killed or failed tar never leaves a trusted tarball.
# Beside it: NAME.manifest and NAME.meta (size of the tarball and of its
# contents, which the nodes check before extracting). Sourced; functions only.

# validate_data_paths: every -d path is relative, stays inside $scratch_dir
# (symlinks included) and exists. Sets plan_data_paths (sorted, unique).
validate_data_paths() {
  local path real_scratch real
  plan_data_paths=()
  ((${#opt_data[@]} > 0)) || return 0
  real_scratch=$(cd "$scratch_dir" 2>/dev/null && pwd -P) ||
    usage_error "--data paths are relative to $scratch_dir, which does not exist"
  for path in "${opt_data[@]}"; do
    [[ -n "$path" ]] || usage_error "--data expects a path, got ''"
    [[ "$path" != /* ]] || usage_error "--data paths are relative to \$SCRATCH/$project_name, got the absolute path '$path'"
    [[ "$path" != *$'\n'* && "$path" != *$'\t'* ]] || usage_error "--data paths must not contain newlines or tabs"
    [[ "/$path/" != */../* ]] || usage_error "--data path '$path' must not contain '..'"
    [[ "$path" != -* ]] || usage_error "--data path '$path' must not start with '-'"
    [[ -e "$scratch_dir/$path" ]] || usage_error "--data path '$path' does not exist in $scratch_dir"
    real=$(realpath -e -- "$scratch_dir/$path" 2>/dev/null) || usage_error "--data path '$path' cannot be resolved"
    [[ "$real" == "$real_scratch" || "$real" == "$real_scratch"/* ]] ||
      usage_error "--data path '$path' resolves outside $scratch_dir (symlink to '$real')"
    path=${path%/}
    path=${path#./}
    plan_data_paths+=("$path")
  done
  mapfile -t plan_data_paths < <(printf '%s\n' "${plan_data_paths[@]}" | LC_ALL=C sort -u)
}

# plan_data: the tarball's name, a pure function of the path list and the
# compression, so the rendered script names it without building it.
plan_data() {
  local digest suffix=""
  plan_data_tarball=""
  ((${#plan_data_paths[@]} > 0)) || return 0
  digest=$(printf '%s\0' "${plan_data_paths[@]}" | sha256sum | cut -c1-16)
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
stage_data_tarball() {
  local manifest lock_fd tmp_tar tmp_manifest tar_status bytes
  [[ -n "$plan_data_tarball" ]] || return 0
  mkdir -p "$plan_data_cache" || die "cannot create $plan_data_cache"
  manifest=$(data_manifest) || die "cannot list the --data paths in $scratch_dir"
  if data_cache_matches "$manifest"; then
    info "data: reusing ${plan_data_tarball##*/} (manifest unchanged)"
    return 0
  fi
  # One builder at a time per tarball; the others wait, then find it fresh.
  exec {lock_fd}>"$plan_data_tarball.lock" || die "cannot open $plan_data_tarball.lock"
  flock -w 3600 "$lock_fd" || die "timed out waiting for another submission building ${plan_data_tarball##*/}"
  manifest=$(data_manifest) || die "cannot list the --data paths in $scratch_dir"
  if data_cache_matches "$manifest"; then
    exec {lock_fd}>&-
    info "data: reusing ${plan_data_tarball##*/} (built by a concurrent submission)"
    return 0
  fi
  info "data: building ${plan_data_tarball##*/} from ${#plan_data_paths[@]} path(s) ..."
  tmp_tar=$(mktemp "$plan_data_tarball.tmp.XXXXXX") || die "mktemp failed in $plan_data_cache"
  tmp_manifest=$(mktemp "$plan_data_tarball.manifest.XXXXXX") || die "mktemp failed in $plan_data_cache"
  register_cleanup "$tmp_tar"
  register_cleanup "$tmp_manifest"
  tar_status=0
  case "$opt_compress" in
    none) tar -C "$scratch_dir" -cf "$tmp_tar" -- "${plan_data_paths[@]}" || tar_status=$? ;;
    *) tar -C "$scratch_dir" --use-compress-program="$opt_compress" -cf "$tmp_tar" -- "${plan_data_paths[@]}" || tar_status=$? ;;
  esac
  ((tar_status == 0)) || die "tar failed (exit $tar_status) building the data tarball; nothing was submitted"
  bytes=$(awk -F '\t' '{ total += $2 } END { printf "%d", total }' <<<"$manifest")
  printf '%s\n' "$manifest" >"$tmp_manifest" || die "cannot write the data manifest"
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tmp_tar")" "$bytes" >"$plan_data_tarball.meta.tmp" ||
    die "cannot write $plan_data_tarball.meta"
  # Tarball first, manifest last: a manifest only ever describes a complete tarball.
  mv -f "$tmp_tar" "$plan_data_tarball" || die "cannot move the data tarball into $plan_data_cache"
  mv -f "$plan_data_tarball.meta.tmp" "$plan_data_tarball.meta" || die "cannot write $plan_data_tarball.meta"
  mv -f "$tmp_manifest" "$plan_data_tarball.manifest" || die "cannot write $plan_data_tarball.manifest"
  exec {lock_fd}>&-
  info "data: built ${plan_data_tarball##*/} ($(stat -c %s "$plan_data_tarball") bytes)"
}

# data_cache_matches MANIFEST: the cached tarball is complete and describes
# exactly these files.
data_cache_matches() {
  local manifest=$1 size recorded
  [[ -f "$plan_data_tarball" && -f "$plan_data_tarball.manifest" && -f "$plan_data_tarball.meta" ]] || return 1
  [[ "$(<"$plan_data_tarball.manifest")" == "$manifest" ]] || return 1
  size=$(stat -c %s "$plan_data_tarball")
  recorded=$(sed -n 's/^tarball_bytes=//p' "$plan_data_tarball.meta")
  [[ "$size" == "$recorded" ]]
}
