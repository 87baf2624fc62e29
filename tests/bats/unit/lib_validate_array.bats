#!/usr/bin/env bats
# hpc_files/lib/validate.sh validate_array_size: an array job larger than the
# cluster's MaxArraySize is refused before sbatch, naming both numbers.

load '../test_helper'

setup() {
  bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  # scontrol show config prints $FAKE_MAX_ARRAY (or fails when it is 'fail').
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$BATS_TEST_TMPDIR/scontrol.log"
[[ "$FAKE_MAX_ARRAY" != fail ]] || exit 1
printf 'Configuration data as of 2026-11-23T14:00:00\nMaxArraySize            = %s\nMaxJobCount             = 10000\n' "$FAKE_MAX_ARRAY"
STUB
  chmod +x "$bin/scontrol"
  export PATH="$bin:$PATH"
}

# check TRIALS: validate_array_size TRIALS in a fresh bash.
check() {
  run --separate-stderr bash -c 'set -euo pipefail
    source "$1/hpc_files/lib/common.sh"; source "$1/hpc_files/lib/validate.sh"
    validate_array_size "$2"; echo fine' _ "$REPO_ROOT" "$1"
}

@test "an array that fits MaxArraySize passes (indices 0..N-1 below it)" {
  export FAKE_MAX_ARRAY=1001
  check 1001
  assert_success
  assert_output fine
}

@test "an array larger than MaxArraySize is refused with both numbers" {
  export FAKE_MAX_ARRAY=1001
  check 1002
  assert_failure 2
  assert_output ''
  assert_equal "$stderr" "job_submitter.sh: error: this submission has 1002 trials (array indices 0-1001) but the cluster's MaxArraySize is 1001 (indices up to 1000); split the experiments into several submissions"
}

@test "one trial is not an array: scontrol is not even asked" {
  export FAKE_MAX_ARRAY=1
  check 1
  assert_success
  assert_file_not_exists "$BATS_TEST_TMPDIR/scontrol.log"
}

@test "no answer from scontrol (no cluster here): nothing is refused" {
  export FAKE_MAX_ARRAY=fail
  check 5000
  assert_success
  export FAKE_MAX_ARRAY='$(touch x)'
  check 5000
  assert_success
}
