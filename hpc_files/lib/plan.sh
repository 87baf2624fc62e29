# shellcheck shell=bash
# The resource layout: from nodes N, GPUs per node G and CPUs per GPU C to the
# numbers sbatch gets, per distributed kind. Pure arithmetic on validated
# settings; sets plan_* variables. Sourced; functions only.
#
#   lightning  N nodes x G tasks (one per GPU), C CPUs each; one srun starts all
#   torchrun   N nodes x 1 task, C*G CPUs; torchrun starts G processes per node
#   none       1 node x 1 task, C*max(G,1) CPUs; the command runs as it is
#   G = 0      no --gres line at all; lightning and torchrun get K processes
#              per node (--tasks-per-node, default 1), none one process

# project_paths: where the project and its scratch folders are. The project
# root is the folder holding hpc_files/, whatever the current directory.
project_paths() {
  source_dir=${HPC_FILES_DIR%/*}
  case "$HPC_FILES_DIR/" in
    # Not shaped as 'cd DIR && pwd' prints a folder: let cd work it out.
    [!/]* | / | *//* | */./* | */../*) source_dir=$(cd "$HPC_FILES_DIR/.." && pwd) ;;
  esac
  : "${source_dir:=/}"
  project_name=${source_dir##*/}
}

scratch_paths() {
  scratch_dir="$SCRATCH/$project_name"
  plan_log_dir="$scratch_dir/hpc_outputs"
  plan_exp_dir="$scratch_dir/$opt_exp_name"
}

# format_memory MB [VAR]: the shortest exact SLURM size (20480 -> 20G).
format_memory() {
  local mb=$1
  if ((mb % 1048576 == 0)); then
    emit "${2:-}" "$((mb / 1048576))T"
  elif ((mb % 1024 == 0)); then
    emit "${2:-}" "$((mb / 1024))G"
  else
    emit "${2:-}" "${mb}M"
  fi
}

plan_layout() {
  # Processes per node: one per GPU, or --tasks-per-node when CPU-only.
  local procs=$((opt_gpus > 0 ? opt_gpus : opt_tasks_per_node))
  [[ "$opt_kind" != none ]] || procs=$((opt_gpus > 0 ? opt_gpus : 1))
  plan_nodes=$opt_nodes
  case "$opt_kind" in
    lightning)
      plan_tasks_per_node=$procs
      plan_cpus_per_task=$opt_cpus
      plan_procs_per_node=$procs
      ;;
    torchrun | none)
      plan_tasks_per_node=1
      plan_cpus_per_task=$((opt_cpus * procs))
      plan_procs_per_node=$procs
      ;;
  esac
  [[ "$opt_kind" != none ]] || plan_procs_per_node=1
  plan_world_size=$((plan_nodes * plan_procs_per_node))
  plan_cpus_per_node=$((plan_tasks_per_node * plan_cpus_per_task))
  if [[ -n "${site_max_cpus_per_node:-}" ]] && ((plan_cpus_per_node > site_max_cpus_per_node)); then
    usage_error "this layout needs $plan_cpus_per_node CPUs per node ($plan_tasks_per_node tasks x $plan_cpus_per_task CPUs) but site '$site_name' nodes have $site_max_cpus_per_node; lower --cpus or --gpus"
  fi
  plan_gres=""
  if ((opt_gpus > 0)); then
    plan_gres="gpu:${opt_gpu_type:+$opt_gpu_type:}$opt_gpus"
  fi
  format_memory $((plan_mem_per_gpu_mb * procs)) plan_mem
  plan_job_name="${project_name}_${opt_exp_name}"
  # The requeue protocol's sbatch options: the script's #SBATCH lines, and
  # sbatch's command line too, where SBATCH_* variables cannot change them.
  plan_signal=""
  [[ -n "${opt_no_signal:-}" ]] || plan_signal=${opt_signal#SIG}
  plan_requeue_args=(--open-mode=append)
  [[ -z "$plan_signal" ]] || plan_requeue_args+=("--signal=B:$plan_signal@$opt_signal_lead")
  plan_requeue_args+=(--requeue)
}

# plan_array TRIALS: array job when there is more than one trial.
plan_array() {
  local trials=$1
  plan_trial_count=$trials
  plan_array_spec=""
  if ((trials > 1)) || [[ -n "${opt_wandb_sweep:-}" ]]; then
    plan_array_spec="0-$((trials - 1))"
    [[ -z "${opt_array_throttle:-}" ]] || plan_array_spec+="%$opt_array_throttle"
    plan_log_name=%x_%A_%a.out
  else
    plan_log_name=%x_%j.out
  fi
  # sbatch reads '%' in --output as a pattern: '%%' is a literal one.
  plan_log_file="${plan_log_dir//%/%%}/$plan_log_name"
}

# plan_submission_folder DIR: the folder the job runs from, and where its
# code is: the snapshot inside it, or the live project with --no-snapshot.
plan_submission_folder() {
  plan_submission_dir=$1
  if [[ -n "${opt_no_snapshot:-}" ]]; then
    plan_code_dir=$source_dir
  else
    plan_code_dir="$1/code"
  fi
}
