#!/usr/bin/env bats
# hpc_files/lib/data.sh: -d paths checked against $plan_scratch_dir, the tarball's
# name, its manifest, when the cache is trusted, building and pruning. Called
# directly on a scratch folder with a space in its path.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
HPC_PROG=job_submitter.sh
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/plan.sh
source "$HPC_FILES_DIR/lib/plan.sh"
# shellcheck source=../../../hpc_files/lib/data.sh
source "$HPC_FILES_DIR/lib/data.sh"

setup() {
  project_name=proj
  plan_scratch_dir="$BATS_TEST_TMPDIR/scratch space/proj"
  plan_data_cache="$plan_scratch_dir/.hpc_data_cache"
  mkdir -p "$plan_scratch_dir/ds one/sub" "$plan_scratch_dir/labels"
  printf 'a\n' >"$plan_scratch_dir/ds one/a.txt"
  printf 'bb\n' >"$plan_scratch_dir/ds one/sub/b.txt"
  printf 'l\n' >"$plan_scratch_dir/labels/l.csv"
  opt_data=()
  opt_compress=none
}

# planned PATH...: validate_data_paths and plan_data for these -d paths.
planned() {
  opt_data=("$@")
  validate_data_paths
  plan_data
}

@test "plan_data after validate_data_paths: sorted, unique, without './' or a trailing '/'" {
  planned labels/ './ds one' labels
  assert_equal "${#plan_data_paths[@]}" 2
  assert_equal "${plan_data_paths[0]}" "ds one"
  assert_equal "${plan_data_paths[1]}" labels
  planned
  assert_equal "${#plan_data_paths[@]}" 0
}

@test "validate_data_paths: a bad path exits 2 with one line naming it" {
  run --separate-stderr validate_data_paths_for /abs
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --data paths are relative to \$SCRATCH/proj, got the absolute path '/abs'"
  run --separate-stderr validate_data_paths_for labels nosuch
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --data path 'nosuch' does not exist in $plan_scratch_dir"
}

# validate_data_paths_for PATH...: validate_data_paths with these -d paths.
validate_data_paths_for() {
  opt_data=("$@")
  validate_data_paths
}

@test "validate_data_paths: a symlink to a shared dataset outside \$plan_scratch_dir is accepted, as one inside is" {
  mkdir -p "$BATS_TEST_TMPDIR/datashare/imagenet" "$plan_scratch_dir/datasets"
  ln -s "$BATS_TEST_TMPDIR/datashare/imagenet" "$plan_scratch_dir/datasets/imagenet"
  ln -s "$plan_scratch_dir/labels" "$plan_scratch_dir/inside"
  run --separate-stderr validate_data_paths_for labels datasets/imagenet inside
  assert_success
}

@test "validate_data_paths: the first path with a problem, in order, is the one named" {
  run --separate-stderr validate_data_paths_for labels '../up' nosuch
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --data path '../up' must not contain '..'"
}

@test "data_path_problem: each problem in words, '' for a good path" {
  run data_path_problem "ds one"
  assert_output ""
  run data_path_problem ""
  assert_output "--data expects a path, got ''"
  run data_path_problem $'a\nb'
  assert_output "--data paths must not contain newlines or tabs"
  run data_path_problem "labels/../../x"
  assert_output "--data path 'labels/../../x' must not contain '..'"
  run data_path_problem "-rf"
  assert_output "--data path '-rf' must not start with '-'"
}

@test "name_data_tarball: a digest of the path list, then one of the manifest, with the compression's suffix; no paths, no tarball" {
  local first
  planned 'ds one' labels
  name_data_tarball
  assert_regex "$plan_data_tarball" "^$plan_scratch_dir/\.hpc_data_cache/data-$plan_data_paths_digest-[0-9a-f]{16}\.tar$"
  assert_regex "$plan_data_paths_digest" '^[0-9a-f]{16}$'
  assert_equal "$plan_data_cache" "$plan_scratch_dir/.hpc_data_cache"
  first=$plan_data_tarball
  planned labels 'ds one'
  name_data_tarball
  assert_equal "$plan_data_tarball" "$first"
  planned labels
  name_data_tarball
  [[ "$plan_data_tarball" != "$first" ]] || fail "another path list, the same name"
  opt_compress=zstd
  planned 'ds one' labels
  name_data_tarball
  assert_equal "$plan_data_tarball" "$first.zst"
  opt_compress=pigz
  planned 'ds one' labels
  name_data_tarball
  assert_equal "$plan_data_tarball" "$first.gz"
  # The same paths with a changed file: the same first digest, another second.
  opt_compress=none
  printf 'x' >>"$plan_scratch_dir/labels/l.csv"
  planned 'ds one' labels
  name_data_tarball
  assert_equal "${plan_data_tarball%-*}" "${first%-*}"
  [[ "$plan_data_tarball" != "$first" ]] || fail "changed contents, the same name"
  planned
  name_data_tarball
  assert_equal "$plan_data_tarball" ""
}

@test "data_manifest: one sorted line per file and folder: path, size, mtime, type" {
  planned labels
  touch -d '2020-01-02 03:04:05 UTC' "$plan_scratch_dir/labels/l.csv"
  run data_manifest
  assert_success
  assert_equal "${#lines[@]}" 2
  assert_regex "${lines[0]}" $'^labels\t[0-9]+\t[0-9.]+\td$'
  assert_equal "${lines[1]}" $'labels/l.csv\t2\t1577934245.0000000000\tf'
}

@test "stage_data_tarball: builds the tarball, its manifest and its .meta (sizes), then reuses it" {
  planned 'ds one' labels
  name_data_tarball # what stage_data_tarball names, in this shell (run's is a subshell)
  run --separate-stderr stage_data_tarball
  assert_success
  assert_regex "$stderr" "data: building ${plan_data_tarball##*/} from 2 path\(s\) \.\.\."
  assert_equal "$(meta_value "$plan_data_tarball.meta" tarball_bytes)" "$(stat -c %s "$plan_data_tarball")"
  assert_equal "$(meta_value "$plan_data_tarball.meta" content_bytes)" \
    "$(data_manifest | awk -F '\t' '{ total += $2 } END { print total }')"
  assert_equal "$(cat "$plan_data_tarball.manifest")" "$(data_manifest)"
  assert_equal "$(tar -xOf "$plan_data_tarball" 'ds one/sub/b.txt')" bb
  run --separate-stderr stage_data_tarball
  assert_equal "$stderr" "job_submitter.sh: data: reusing ${plan_data_tarball##*/} (manifest unchanged)"
  # Another submission's name for the same data is this one.
  local built=$plan_data_tarball
  name_data_tarball
  assert_equal "$plan_data_tarball" "$built"
}

@test "name_data_tarball: takes the digest start_data_digest wrote in the background; takes its own where none was started" {
  planned 'ds one' labels
  name_data_tarball
  local own=$plan_data_tarball
  start_data_digest
  local pid=$background_pid_data_digest
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  # What the background step wrote is what names the tarball.
  printf 'feedfacefeedface0000' >"$work_dir/data.digest"
  name_data_tarball
  assert_equal "${plan_data_tarball##*/}" "data-$plan_data_paths_digest-feedfacefeedface.tar"
  # Awaited once; the next naming takes the digest itself.
  name_data_tarball
  assert_equal "$plan_data_tarball" "$own"
}

@test "data_tarball_complete: only a tarball whose .meta exists and gives its size" {
  planned 'ds one' labels
  stage_data_tarball 2>/dev/null
  data_tarball_complete || fail "a built tarball is not complete"
  # A truncated tarball: its size is not the .meta's; the next submission builds it again.
  truncate -s -1 "$plan_data_tarball"
  ! data_tarball_complete || fail "a truncated tarball is complete"
  run --separate-stderr stage_data_tarball
  assert_regex "$stderr" "data: building ${plan_data_tarball##*/} "
  data_tarball_complete || fail "the rebuilt tarball is not complete"
  # No .meta: never completed.
  rm "$plan_data_tarball.meta"
  ! data_tarball_complete || fail "a tarball without .meta is complete"
}

@test "stage_data_tarball: a changed file builds another tarball and leaves the earlier one as it was" {
  local first
  planned 'ds one' labels
  stage_data_tarball 2>/dev/null
  first=$plan_data_tarball
  printf 'changed\n' >"$plan_scratch_dir/labels/l.csv"
  run --separate-stderr stage_data_tarball
  name_data_tarball
  [[ "$plan_data_tarball" != "$first" ]] || fail "a changed file, the same tarball"
  assert_equal "$stderr" "job_submitter.sh: data: building ${plan_data_tarball##*/} from 2 path(s); 1 earlier tarball(s) of these paths (0 MiB) stay for the submissions that name them (--prune-data-cache removes those none names) ...
job_submitter.sh: data: built ${plan_data_tarball##*/} ($(stat -c %s "$plan_data_tarball") bytes)"
  assert_equal "$(tar -xOf "$plan_data_tarball" labels/l.csv)" changed
  assert_equal "$(tar -xOf "$first" labels/l.csv)" l
  data_tarball_complete || fail "the new tarball is not complete"
}

@test "stage_data_tarball: paths that change between naming the tarball and building it stop the submission" {
  planned 'ds one' labels
  # data_manifest lists the paths twice: once to name, once to build; the second sees a change.
  eval "$(declare -f data_manifest | sed '1s/data_manifest/original_manifest/')"
  data_manifest() {
    original_manifest
    [[ ! -e "$BATS_TEST_TMPDIR/named" ]] || printf 'late\t1\t1\tf\n'
    : >"$BATS_TEST_TMPDIR/named"
  }
  run --separate-stderr stage_data_tarball
  assert_failure 1
  assert_equal "${stderr_lines[-1]}" "job_submitter.sh: error: the --data paths changed while this submission named their tarball; submit again"
  assert_equal "$(find "$plan_data_cache" -name 'data-*.tar')" ""
}

@test "prune_data_cache: removes tarballs no job.sbatch names, keeps named and locked ones" {
  local cache="$plan_scratch_dir/.hpc_data_cache" named="data-00000000000000aa.tar"
  mkdir -p "$cache" "$plan_scratch_dir/exp/20260101-000000-abcd"
  printf 'export HPC_DATA_TARBALL=%s\n' "'$cache/$named'" >"$plan_scratch_dir/exp/20260101-000000-abcd/job.sbatch"
  for name in "$named" data-00000000000000bb.tar.zst data-00000000000000cc.tar; do
    printf 'x' >"$cache/$name"
    printf 'tarball_bytes=1\n' >"$cache/$name.meta"
    : >"$cache/$name.manifest"
  done
  exec {lock}>"$cache/data-00000000000000cc.tar.lock"
  flock "$lock"
  run --separate-stderr prune_data_cache
  exec {lock}>&-
  assert_success
  assert_equal "$(cd "$cache" && ls | LC_ALL=C sort | tr '\n' ' ')" \
    "$named $named.manifest $named.meta data-00000000000000cc.tar data-00000000000000cc.tar.lock data-00000000000000cc.tar.manifest data-00000000000000cc.tar.meta "
  assert_equal "${stderr_lines[-1]}" "job_submitter.sh: data cache: removed 1 tarball(s), 0 MiB; kept 2 named by a submission folder or in use"
}

@test "stage_data_tarball: a -d path that is a symlink (or holds one) stages the files it leads to, and a change there builds another tarball" {
  local first
  mkdir -p "$plan_scratch_dir/data-v1"
  printf 'v1\n' >"$plan_scratch_dir/data-v1/x.csv"
  ln -s data-v1 "$plan_scratch_dir/current"
  ln -s ../labels/l.csv "$plan_scratch_dir/data-v1/labels.csv"
  planned current
  stage_data_tarball 2>/dev/null
  first=$plan_data_tarball
  # The files themselves, under the -d path's name: the job reads its node-local copy.
  run tar -tvf "$first"
  assert_success
  refute_output --partial ' -> '
  assert_equal "$(tar -xOf "$first" current/x.csv)" v1
  assert_equal "$(tar -xOf "$first" current/labels.csv)" l
  # The files the links lead to changed: another tarball; the first one keeps v1.
  printf 'v2\n' >"$plan_scratch_dir/data-v1/x.csv"
  stage_data_tarball 2>/dev/null
  [[ "$plan_data_tarball" != "$first" ]] || fail "the linked data changed, the same tarball"
  assert_equal "$(tar -xOf "$plan_data_tarball" current/x.csv)" v2
  assert_equal "$(tar -xOf "$first" current/x.csv)" v1
}

@test "validate_data_paths: a broken symbolic link or a link loop under a -d path is refused in one line, before anything is built" {
  ln -s /nonexistent/target "$plan_scratch_dir/ds one/broken"
  run --separate-stderr validate_data_paths_for 'ds one' labels
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --data path 'ds one' holds a broken symbolic link 'ds one/broken' (the tarball holds what links lead to): remove or repair it"
  rm "$plan_scratch_dir/ds one/broken"
  ln -s .. "$plan_scratch_dir/ds one/sub/up"
  run --separate-stderr validate_data_paths_for labels 'ds one'
  assert_failure 2
  assert_regex "$stderr" "^job_submitter.sh: error: --data path 'ds one': File system loop detected; 'ds one/sub/up' is part of the same file system loop as 'ds one'\. \(the tarball holds what links lead to\): remove the link$"
  rm "$plan_scratch_dir/ds one/sub/up"
  run validate_data_paths_for 'ds one' labels
  assert_success
}
