#!/usr/bin/env bats
# hpc_files/lib/plan.sh: memory sizes, the layout per distributed kind, what
# the site profile defaults, arrays. Each plan is made as job_submitter.sh
# makes it, from the submitter's options: a fresh bash sources the libraries
# (they declare global tables), parses the options, reads the site profile
# and plans; nothing is preset but SCRATCH and the project's name.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/plan.sh
source "$HPC_FILES_DIR/lib/plan.sh"

setup() {
  unset HPC_SITE HPC_SITES_DIR
  export SITE_FILE="$BATS_TEST_TMPDIR/test.conf"
  printf 'max_cpus_per_node = 8\n' >"$SITE_FILE"
}

# planned CODE ARG...: validate_settings and plan_settings for the
# submitter's options ARG... (project 'proj', SCRATCH '/s p'), then CODE;
# with run's status and output.
planned() {
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1 code=$2
    shift 2
    for lib in common options site validate plan; do
      source "$HPC_FILES_DIR/lib/$lib.sh"
    done
    SCRATCH="/s p"
    project_paths
    project_name=proj
    parse_options "$@"
    apply_defaults
    load_site
    validate_settings
    plan_settings
    eval "$code"' _ "$HPC_FILES_DIR" "$@"
}

# layout_is ARG... -- NODES TASKS_PER_NODE CPUS_PER_TASK PROCS_PER_NODE WORLD GRES MEM
layout_is() {
  local -a args=()
  while [[ "$1" != -- ]]; do
    args+=("$1")
    shift
  done
  shift
  planned 'printf "%s\n" "$plan_nodes $plan_tasks_per_node $plan_cpus_per_task $plan_procs_per_node $plan_world_size" "$plan_gres" "$plan_mem" "$plan_cpus_per_node"' "${args[@]}"
  assert_success
  assert_equal "$output" "$1 $2 $3 $4 $5
$6
$7
$(($2 * $3))"
}

@test "format_memory: the shortest exact SLURM size" {
  run format_memory 20480
  assert_output 20G
  run format_memory 1536
  assert_output 1536M
  run format_memory 1024
  assert_output 1G
  run format_memory 1
  assert_output 1M
  run format_memory 1048576
  assert_output 1T
  run format_memory 3145728
  assert_output 3T
  run format_memory 1049600
  assert_output 1025G
}

@test "lightning: one task per GPU, C CPUs each" {
  layout_is -W lightning -n 2 -g 4 -c 3 -- 2 4 3 4 8 gpu:4 40G
  planned 'printf "%s %s" "$plan_job_name" "$plan_kind"' -e exp
  assert_output "proj_exp lightning"
}

@test "torchrun (and script): one task per node with C x G CPUs, G processes" {
  layout_is -W torchrun -n 2 -g 4 -c 3 -- 2 1 12 4 8 gpu:4 40G
  layout_is -W script -n 2 -g 4 -c 3 -- 2 1 12 4 8 gpu:4 40G
  planned 'printf "%s" "$plan_kind"' -W script
  assert_output torchrun
}

@test "none: one process with C x G CPUs" {
  layout_is -W none -g 2 -c 3 -- 1 1 6 1 1 gpu:2 20G
}

@test "a wandb sweep runs one process per task (none)" {
  planned 'printf "%s %s" "$plan_kind" "$plan_sweep_count"' -w abc --sweep-count 007
  assert_output "none 7"
}

@test "torchrun with no GPUs: no gres, one process per node" {
  layout_is -W torchrun -n 3 -g 0 -c 4 -- 3 1 4 1 3 "" 10G
}

@test "none with no GPUs" {
  layout_is -W none -g 0 -c 2 -- 1 1 2 1 1 "" 10G
}

@test "numbers with leading zeros are decimal, never octal" {
  layout_is -W lightning -n 02 -g 010 -c 08 -- 2 10 8 10 20 gpu:10 100G
  planned 'printf "%s %s %s" "$plan_signal_lead" "$plan_max_requeues" "${plan_requeue_args[*]}"' --signal-lead 090 --max-requeues 010
  assert_output "90 10 --open-mode=append --signal=B:USR1@90 --requeue"
}

@test "a GPU type goes into the gres" {
  planned 'printf "%s" "$plan_gres"' -G v100l -g 2
  assert_output gpu:v100l:2
}

@test "memory is per GPU and in MiB when not whole GiB" {
  layout_is -g 3 -c 1 -m 512M -- 1 3 1 3 3 gpu:3 1536M
}

@test "a layout that needs more CPUs per node than the site's nodes have is refused" {
  planned 'true' --site "$SITE_FILE" -g 4 -c 3
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: this layout needs 12 CPUs per node (4 tasks x 3 CPUs) but site '$SITE_FILE' nodes have 8; lower --cpus or --gpus"
  planned 'printf "%s" "$plan_cpus_per_node"' --site "$SITE_FILE" -g 4 -c 2
  assert_success
  assert_output 8
}

@test "--no-signal: no signal in the requeue arguments; --signal SIGUSR2 is USR2" {
  planned 'printf "[%s] %s" "$plan_signal" "${plan_requeue_args[*]}"' --no-signal
  assert_output "[] --open-mode=append --requeue"
  planned 'printf "[%s] %s" "$plan_signal" "${plan_requeue_args[*]}"' --signal SIGUSR2 --signal-lead 60
  assert_output "[USR2] --open-mode=append --signal=B:USR2@60 --requeue"
}

@test "command-line values win over the site's" {
  printf '%s\n' 'account = site-acct' 'partition = site-part' 'modules = site/1' 'array_throttle = 7' >"$SITE_FILE"
  planned 'printf "%s\n" "$plan_account" "$plan_partition" "$plan_modules" "$plan_array_throttle"' \
    --site "$SITE_FILE" -a mine -p other --modules mod/2 --array-throttle 03
  assert_success
  assert_equal "$output" "mine
other
mod/2
3"
}

@test "site values fill what the command line left open; --modules '' loads none" {
  printf '%s\n' 'account = site-acct' 'partition = site-part' 'modules = site/1' 'array_throttle = 7' >"$SITE_FILE"
  planned 'printf "%s\n" "$plan_account" "$plan_partition" "$plan_modules" "$plan_array_throttle"' --site "$SITE_FILE" -a mine
  assert_success
  assert_equal "$output" "mine
site-part
site/1
7"
  planned 'printf "[%s]" "$plan_modules"' --site "$SITE_FILE" --modules ''
  assert_output "[]"
}

@test "the site's sbatch lines come before --sbatch-arg; its env names are passed once" {
  printf '%s\n' 'sbatch = --exclusive' 'env = A=1' 'env = B=2' 'env = A=3' 'tmpdir_base = /t/$USER' >"$SITE_FILE"
  planned 'printf "%s\n" "${plan_sbatch_args[@]}" "$plan_pass_env" "$plan_tmpdir_mode $plan_tmpdir_base"' \
    --site "$SITE_FILE" --sbatch-arg=--constraint=ib
  assert_success
  assert_equal "$output" '--exclusive
--constraint=ib
A B
auto /t/$USER'
}

@test "plan_paths: the project's folders under SCRATCH" {
  planned 'printf "%s\n" "$plan_scratch_dir" "$plan_log_dir" "$plan_exp_dir" "$plan_data_cache"' -e exp
  assert_equal "$output" "/s p/proj
/s p/proj/hpc_outputs
/s p/proj/exp
/s p/proj/.hpc_data_cache"
}

@test "plan_data: the paths sorted and unique, and a digest of them" {
  local first
  planned 'printf "%s\n" "${plan_data_paths[@]}" "$plan_data_paths_digest"' -d b/ ./a b
  assert_success
  assert_line --index 0 a
  assert_line --index 1 b
  [[ "${lines[2]}" =~ ^[0-9a-f]{16}$ ]] || fail "digest: ${lines[2]}"
  first=${lines[2]}
  planned 'printf "%s" "$plan_data_paths_digest"' -d a b --compress zstd
  assert_output "$first"
  planned 'printf "%s" "$plan_data_paths_digest"' -d a
  [[ "$output" != "$first" ]] || fail "another path list, the same digest"
  planned 'printf "[%s] [%s]" "$plan_data_paths_digest" "$plan_data_tarball"'
  assert_output "[] []"
}

@test "data_tarball_name: one name for the plan and the pattern prune globs" {
  run data_tarball_name abc none
  assert_output data-abc.tar
  run data_tarball_name abc zstd
  assert_output data-abc.tar.zst
  run data_tarball_name '*' pigz
  assert_output 'data-*.tar.gz'
}

@test "plan_array: one trial is no array" {
  planned 'plan_array 1; printf "[%s] %s" "$plan_array_spec" "$plan_log_file"'
  assert_output "[] /s p/proj/hpc_outputs/%x_%j.out"
}

@test "plan_array: several trials, throttled" {
  planned 'plan_array 5; printf "[%s] %s" "$plan_array_spec" "$plan_log_file"' --array-throttle 2
  assert_output "[0-4%2] /s p/proj/hpc_outputs/%x_%A_%a.out"
}

@test "plan_array: a wandb sweep is an array even with one task" {
  planned 'plan_array 1; printf "%s" "$plan_array_spec"' -w abc --sweep-count 1
  assert_output "0-0"
}

@test "plan_array: a later bayes round runs its own tasks only, even one" {
  planned 'plan_array 6 5; printf "%s %s" "$plan_array_spec" "$plan_trial_count"' --array-throttle 2
  assert_output "5-5%2 6"
}

@test "plan_submission_folder: the snapshot inside it, or the live project" {
  planned 'plan_submission_folder /x/f; printf "%s [%s] [%s]\n" "$plan_code_dir" "$plan_snapshot" "$plan_preview"
    plan_submission_folder /x/f 1; printf "[%s]\n" "$plan_preview"'
  assert_equal "$output" "/x/f/code [1] []
[1]"
  planned 'plan_submission_folder /x/f; printf "%s [%s]" "$plan_code_dir" "$plan_snapshot"' --no-snapshot
  assert_output "$REPO_ROOT []"
}
