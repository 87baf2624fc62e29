#!/usr/bin/env bats
# hpc_files/lib/validate.sh: SLURM times and sizes, and the require_* checks.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/validate.sh
source "$HPC_FILES_DIR/lib/validate.sh"

# time_is VALUE SECONDS: parse_slurm_time VALUE prints SECONDS (nothing when SECONDS is '').
time_is() {
  run parse_slurm_time "$1"
  assert_success
  [[ "$output" == "$2" ]] || fail "parse_slurm_time '$1' printed '$output', expected '$2'"
}

@test "parse_slurm_time: minutes" {
  time_is 30 1800
  time_is 0 0
  time_is 08 480
  time_is 1440 86400
}

@test "parse_slurm_time: minutes:seconds" {
  time_is 1:30 90
  time_is 90:00 5400
  time_is 09:09 549
}

@test "parse_slurm_time: hours:minutes:seconds" {
  time_is 2:00:00 7200
  time_is 00:00:01 1
  time_is 48:00:00 172800
  time_is 0:90:00 5400
}

@test "parse_slurm_time: days-hours" {
  time_is 1-0 86400
  time_is 00-01 3600
  time_is 7-00 604800
}

@test "parse_slurm_time: days-hours:minutes" {
  time_is 1-2:30 95400
}

@test "parse_slurm_time: days-hours:minutes:seconds" {
  time_is 1-02:03:04 93784
  time_is 00-01:00:00 3600
}

@test "parse_slurm_time: anything else prints nothing" {
  local v
  for v in '' abc 1:2:3:4 1:60 1:60:00 10:61 -1 1- -1-0 1-2:3:4:5 '1 ' ' 1' 1.5 1h 12345-0 1-123 1:2:3- 1234567 '1-2 :3'; do
    time_is "$v" ""
  done
}

@test "parse_slurm_time: D-HH with hours above 23 prints nothing" {
  time_is 1-24 ""
  time_is 00-25:00:00 ""
}

# mem_is VALUE MIB
mem_is() {
  run parse_memory_mb "$1"
  assert_success
  [[ "$output" == "$2" ]] || fail "parse_memory_mb '$1' printed '$output', expected '$2'"
}

@test "parse_memory_mb" {
  mem_is 10G 10240
  mem_is 010G 10240
  mem_is 512M 512
  mem_is 2048 2048
  mem_is 1T 1048576
  mem_is 1K 1
  mem_is 1025K 2
  mem_is 0 0
}

@test "parse_memory_mb: anything else prints nothing" {
  local v
  for v in '' 10X -1G 1.5G ' 10G' '10G ' G 10GB 1234567890G; do
    mem_is "$v" ""
  done
}

@test "require_uint accepts whole numbers in range" {
  run require_uint --gpus 0 0 8
  assert_success
  run require_uint --gpus 08 0 8
  assert_success
}

@test "require_uint refuses with the option, the value and the range" {
  run --separate-stderr require_uint --gpus 9 0 8
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --gpus must be at most 8, got '9'"
  run --separate-stderr require_uint --cpus 0 1
  assert_equal "$stderr" "job_submitter.sh: error: --cpus must be at least 1, got '0'"
  run --separate-stderr require_uint --cpus 1x 1
  assert_equal "$stderr" "job_submitter.sh: error: --cpus expects a whole number, got '1x'"
  run --separate-stderr require_uint --cpus 1234567890 1
  assert_equal "$stderr" "job_submitter.sh: error: --cpus is out of range, got '1234567890'"
}

@test "require_name" {
  run require_name --exp-name a.b_c-1
  assert_success
  local bad
  for bad in '' -a .a 'a b' 'a/b' 'a,b' $'a\nb' "$(printf 'x%.0s' {1..101})"; do
    run require_name --exp-name "$bad"
    assert_failure 2
  done
}

@test "require_one_of" {
  run require_one_of --compress zstd none zstd pigz
  assert_success
  run --separate-stderr require_one_of --compress xz none zstd pigz
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --compress expects one of: none zstd pigz; got 'xz'"
}

# settings_around STEP ARG...: in a fresh bash, parse the submitter's options
# ARG... (with the defaults), read the site, then print every opt_* and
# plan_* variable (declare -p) before and after STEP, separated by '--'.
settings_around() {
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1 step=$2
    shift 2
    for lib in common options site validate plan; do
      source "$HPC_FILES_DIR/lib/$lib.sh"
    done
    SCRATCH=/scratch
    project_paths
    parse_options "$@"
    apply_defaults
    load_site
    declare -p ${!opt_@} ${!plan_@} 2>/dev/null || true
    echo --
    $step
    declare -p ${!opt_@} ${!plan_@} 2>/dev/null || true' _ "$REPO_ROOT/hpc_files" "$@"
}

@test "validate_settings checks and stops: it changes no opt_* and sets no plan_*" {
  local before
  settings_around validate_settings -C "$FIXTURES/configs/one_line.txt" -g 02 -c 08 -n 01 -W script \
    --signal-lead 030 --max-requeues 05 --array-throttle 04
  assert_success
  before=${output%%$'\n'--$'\n'*}
  assert_equal "${output#*$'\n'--$'\n'}" "$before"
  [[ "$before" == *'opt_gpus="02"'* && "$before" == *'opt_kind="script"'* ]] || fail "not the options given: $before"
}
