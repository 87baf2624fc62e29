#!/usr/bin/env bats
# hpc_files/lib/plan.sh: memory sizes, the layout per distributed kind, arrays.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/plan.sh
source "$HPC_FILES_DIR/lib/plan.sh"

setup() {
  project_name=proj
  opt_exp_name=exp
  opt_gpu_type=""
  site_name=test
  site_max_cpus_per_node=""
  plan_mem_per_gpu_mb=10240
  plan_log_dir="/scratch/proj/hpc_outputs"
  opt_array_throttle=""
  opt_wandb_sweep=""
  opt_tasks_per_node=1
  opt_signal=USR1
  opt_signal_lead=90
}

# layout KIND NODES GPUS CPUS: plan_layout for these settings.
layout() {
  opt_kind=$1 opt_nodes=$2 opt_gpus=$3 opt_cpus=$4
  plan_layout
}

# plan_is NODES TASKS_PER_NODE CPUS_PER_TASK PROCS_PER_NODE WORLD GRES MEM
plan_is() {
  assert_equal "$plan_nodes $plan_tasks_per_node $plan_cpus_per_task $plan_procs_per_node $plan_world_size" "$1 $2 $3 $4 $5"
  assert_equal "$plan_gres" "$6"
  assert_equal "$plan_mem" "$7"
  assert_equal "$plan_cpus_per_node" $(($2 * $3))
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
  layout lightning 2 4 3
  plan_is 2 4 3 4 8 gpu:4 40G
  assert_equal "$plan_job_name" proj_exp
}

@test "torchrun: one task per node with C x G CPUs, G processes" {
  layout torchrun 2 4 3
  plan_is 2 1 12 4 8 gpu:4 40G
}

@test "none: one process with C x G CPUs" {
  layout none 1 2 3
  plan_is 1 1 6 1 1 gpu:2 20G
}

@test "torchrun with no GPUs: no gres, one process per node" {
  layout torchrun 3 0 4
  plan_is 3 1 4 1 3 "" 10G
}

@test "none with no GPUs" {
  layout none 1 0 2
  plan_is 1 1 2 1 1 "" 10G
}

@test "a GPU type goes into the gres" {
  opt_gpu_type=v100l
  layout lightning 1 2 1
  assert_equal "$plan_gres" gpu:v100l:2
}

@test "memory is per GPU and in MiB when not whole GiB" {
  plan_mem_per_gpu_mb=512
  layout lightning 1 3 1
  assert_equal "$plan_mem" 1536M
}

@test "a layout that needs more CPUs per node than the site's nodes have is refused" {
  site_max_cpus_per_node=8
  run --separate-stderr layout lightning 1 4 3
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: this layout needs 12 CPUs per node (4 tasks x 3 CPUs) but site 'test' nodes have 8; lower --cpus or --gpus"
  layout lightning 1 4 2
  assert_equal "$plan_cpus_per_node" 8
}

@test "plan_array: one trial is no array" {
  plan_array 1
  assert_equal "$plan_array_spec" ""
  assert_equal "$plan_log_file" "/scratch/proj/hpc_outputs/%x_%j.out"
}

@test "plan_array: several trials, throttled" {
  opt_array_throttle=2
  plan_array 5
  assert_equal "$plan_array_spec" "0-4%2"
  assert_equal "$plan_log_file" "/scratch/proj/hpc_outputs/%x_%A_%a.out"
}

@test "plan_array: a wandb sweep is an array even with one task" {
  opt_wandb_sweep=abc
  plan_array 1
  assert_equal "$plan_array_spec" "0-0"
}

@test "scratch_paths" {
  SCRATCH="/s p"
  scratch_paths
  assert_equal "$scratch_dir" "/s p/proj"
  assert_equal "$plan_log_dir" "/s p/proj/hpc_outputs"
  assert_equal "$plan_exp_dir" "/s p/proj/exp"
}
