#!/usr/bin/env bats
# hpc_files/lib/validate.sh validate_array_size: the cluster's MaxArraySize
# (for plan_array_split); a method-bayes round above it is refused before
# sbatch, naming both numbers.

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
    validate_array_size "$2"; echo "fine ${cluster_max_array:-none}"' _ "$REPO_ROOT" "$1"
}

@test "an array that fits MaxArraySize passes (indices 0..N-1 below it); a larger one passes too (it is split)" {
  export FAKE_MAX_ARRAY=1001
  check 1001
  assert_success
  assert_output "fine 1001"
  check 1002
  assert_success
  assert_output "fine 1001"
}

@test "a method-bayes round above MaxArraySize is refused with both numbers" {
  export FAKE_MAX_ARRAY=1001 bayes_first=1000
  check 1002
  assert_failure 2
  assert_output ''
  assert_equal "$stderr" "job_submitter.sh: error: this method-bayes round has trials up to 1001 (its array indices) but the cluster's MaxArraySize is 1001 (indices up to 1000); lower --trials or --rounds"
}

@test "one trial is not an array: scontrol is not even asked" {
  export FAKE_MAX_ARRAY=1
  check 1
  assert_success
  assert_output "fine none"
  assert_file_not_exists "$BATS_TEST_TMPDIR/scontrol.log"
}

@test "no answer from scontrol (no cluster here): nothing is refused" {
  export FAKE_MAX_ARRAY=fail
  check 5000
  assert_success
  assert_output "fine none"
  export FAKE_MAX_ARRAY='$(touch x)'
  check 5000
  assert_success
  assert_output "fine none"
}
