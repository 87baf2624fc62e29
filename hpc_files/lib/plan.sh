# shellcheck shell=bash
# The plan: every plan_* variable, computed from the validated options (opt_*)
# and the site profile (site_*), and the only input of rendering. Sourced;
# functions only. The resource layout, per distributed kind, from nodes N,
# GPUs per node G and CPUs per GPU C:
#
#   lightning  N nodes x G tasks (one per GPU), C CPUs each; one srun starts all
#   torchrun   N nodes x 1 task, C*G CPUs; torchrun starts G processes per node
#   none       1 node x 1 task, C*max(G,1) CPUs; the command runs as it is
#   G = 0      no --gres line at all; lightning and torchrun get K processes
#              per node (--tasks-per-node, default 1), none one process

# plan_paths: the project's folders under $SCRATCH (validated).
plan_paths() {
  plan_project_name=$project_name
  plan_scratch_dir="$SCRATCH/$project_name"
  plan_log_dir="$plan_scratch_dir/hpc_outputs"
  plan_exp_dir="$plan_scratch_dir/$opt_exp_name"
  plan_exp_name=$opt_exp_name
  plan_data_cache="$plan_scratch_dir/.hpc_data_cache"
}

# plan_kind_of: -W as the plan uses it: script is torchrun, and a wandb
# sweep task is one agent process (none).
plan_kind_of() {
  local chosen=$opt_kind
  [[ "$chosen" != script ]] || chosen=torchrun
  [[ -z "${opt_wandb_sweep:-}" ]] || chosen=none
  printf '%s' "$chosen"
}

# format_memory MB: the shortest exact SLURM size (20480 -> 20G).
format_memory() {
  local mb=$1
  if ((mb % 1048576 == 0)); then
    printf '%s' "$((mb / 1048576))T"
  elif ((mb % 1024 == 0)); then
    printf '%s' "$((mb / 1024))G"
  else
    printf '%s' "${mb}M"
  fi
}

# plan_settings: the whole plan but the trials (plan_array) and the
# submission folder (plan_submission_folder).
plan_settings() {
  plan_paths
  plan_layout
  plan_site_settings
  plan_runtime
  plan_data
}

plan_layout() {
  local gpus=$((10#$opt_gpus)) cpus=$((10#$opt_cpus)) tasks=$((10#$opt_tasks_per_node)) procs
  plan_kind=$(plan_kind_of)
  plan_nodes=$((10#$opt_nodes))
  plan_gpus_per_node=$gpus
  # Processes per node: one per GPU, or --tasks-per-node when CPU-only.
  procs=$((gpus > 0 ? gpus : tasks))
  [[ "$plan_kind" != none ]] || procs=$((gpus > 0 ? gpus : 1))
  plan_procs_per_node=$procs
  plan_tasks_per_node=1
  plan_cpus_per_task=$((cpus * procs))
  if [[ "$plan_kind" == lightning ]]; then
    plan_tasks_per_node=$procs
    plan_cpus_per_task=$cpus
  fi
  [[ "$plan_kind" != none ]] || plan_procs_per_node=1
  plan_world_size=$((plan_nodes * plan_procs_per_node))
  plan_cpus_per_node=$((plan_tasks_per_node * plan_cpus_per_task))
  if [[ -n "${site_max_cpus_per_node:-}" ]] && ((plan_cpus_per_node > site_max_cpus_per_node)); then
    usage_error "this layout needs $plan_cpus_per_node CPUs per node ($plan_tasks_per_node tasks x $plan_cpus_per_task CPUs) but site '$site_name' nodes have $site_max_cpus_per_node; lower --cpus or --gpus"
  fi
  plan_gres=""
  ((gpus == 0)) || plan_gres="gpu:${opt_gpu_type:+$opt_gpu_type:}$gpus"
  plan_mem_mb=$((valid_mem_per_gpu_mb * procs))
  plan_mem=$(format_memory "$plan_mem_mb")
  plan_time=$opt_time
  plan_time_seconds=$valid_time_seconds
  plan_job_name="${project_name}_${opt_exp_name}"
  plan_max_requeues=$((10#$opt_max_requeues))
  # The requeue protocol's sbatch options: the script's #SBATCH lines, and
  # sbatch's command line too, where SBATCH_* variables cannot change them.
  plan_signal=""
  # An interactive run has no wall-time signal: it ends with its allocation.
  [[ -n "${opt_no_signal:-}${opt_interactive:-}" ]] || plan_signal=${opt_signal#SIG}
  plan_signal_lead=$((10#$opt_signal_lead))
  plan_requeue_args=(--open-mode=append)
  [[ -z "$plan_signal" ]] || plan_requeue_args+=("--signal=B:$plan_signal@$plan_signal_lead")
  plan_requeue_args+=(--requeue)
}

# plan_resource_lines: the site's and --sbatch-arg's --gres and --mem go into
# the job's own lines, as sbatch obeys only the last line of an option: another
# --gres (not a GPU: sbatch_option_owner refuses those) joins its --gres line,
# GPUs first, and the last --mem (0: all of a node's) is its memory per node.
plan_resource_lines() {
  local arg value
  local -a rest=()
  for arg in ${plan_sbatch_args[@]+"${plan_sbatch_args[@]}"}; do
    value=${arg#--*[= ]}
    case "${arg%%[= ]*}" in
      --gres) plan_gres+="${plan_gres:+,}$value" ;;
      --mem)
        plan_mem=$value
        plan_mem_mb=$(parse_memory_mb "$value")
        ;;
      *) rest+=("$arg") ;;
    esac
  done
  plan_sbatch_args=(${rest[@]+"${rest[@]}"})
}

# planned_value NAME: the value the submitter's own line of sbatch
# option NAME (one of SBATCH_PLANNED) has; '' where it writes none.
planned_value() {
  local value
  case "$1" in
    --nodes) value=$plan_nodes ;;
    --ntasks) value=$((plan_nodes * plan_tasks_per_node)) ;;
    --ntasks-per-node) value=$plan_tasks_per_node ;;
    --cpus-per-task) value=$plan_cpus_per_task ;;
    --partition) value=$plan_partition ;;
    --account) value=$plan_account ;;
    --job-name) value=$plan_job_name ;;
  esac
  printf '%s' "$value"
}

# plan_repeated_options: --sbatch-arg joins plan_sbatch_args, but for an
# option the submitter sets with the same value (test-tube's SlurmCluster
# writes ntasks-per-node beside its GPUs): that line is the submitter's
# already. Another value is refused, naming both.
plan_repeated_options() {
  local arg name value planned
  for arg in ${opt_sbatch_arg[@]+"${opt_sbatch_arg[@]}"}; do
    if sbatch_option_planned "$arg"; then
      name=$(sbatch_option_name "$arg")
      value=$(sbatch_option_value "$arg")
      planned=$(planned_value "$name")
      [[ "$value" == "$planned" ]] && continue
      if [[ -n "$planned" ]]; then planned="$name=$planned"; else planned="no $name"; fi
      usage_error "--sbatch-arg=$arg sets what the submitter sets itself; $(sbatch_option_owner "$arg") (this submission sets $planned; the same value is accepted)"
    fi
    plan_sbatch_args+=("$arg")
  done
}

# plan_site_settings: what the site profile sets or defaults, the command
# line winning where it gave the option (--modules '' loads none).
plan_site_settings() {
  plan_site_name=$site_name
  plan_account=${opt_account:-${site_account:-}}
  plan_partition=${opt_partition:-${site_partition:-}}
  plan_modules=${site_modules:-}
  [[ -z "${OPT_GIVEN[modules]:-}" ]] || plan_modules=$opt_modules
  plan_array_throttle=${opt_array_throttle:-${site_array_throttle:-}}
  [[ -z "$plan_array_throttle" ]] || plan_array_throttle=$((10#$plan_array_throttle))
  plan_dependency=${opt_dependency:-}
  plan_sbatch_args=(${site_sbatch[@]+"${site_sbatch[@]}"})
  plan_repeated_options
  plan_resource_lines
  plan_tmpdir_mode=$site_provides_tmpdir
  plan_compute_internet=$site_compute_internet
  plan_tmpdir_base=$site_tmpdir_base
  plan_container_runtime=${site_container_runtime:-}
  plan_env=(${site_env[@]+"${site_env[@]}"})
  plan_pass_env=""
  ((${#plan_env[@]} == 0)) || plan_pass_env=$(site_env_names)
  plan_site_commands=(${site_command[@]+"${site_command[@]}"})
  plan_stage_out=${opt_stage_out:-}
  plan_pass_local_rank=${opt_pass_local_rank:-}
  # --wandb-sync login: the wandb-osh trigger folder, on the shared filesystem
  # where the job writes and the login node's syncer reads.
  plan_wandb_sync=${opt_wandb_sync:-${site_wandb_sync:-$DEFAULT_WANDB_SYNC}}
  plan_wandb_sync_dir=""
  [[ "$plan_wandb_sync" != login ]] || plan_wandb_sync_dir="$plan_exp_dir/wandb_osh"
  plan_sweep_count=${opt_sweep_count:+$((10#$opt_sweep_count))}
}

# plan_runtime: venv or container, and which ones (realpath: as the nodes
# will find them); with --setup-venv the digest the venv is stamped with.
# plan_venv_held: the digest the venv's stamp holds now (a --setup-venv done);
# plan_venv_digest: the one the job expects to find there (its own
# --setup-venv's, else the one held now), checked by node/batch.sh.
plan_runtime() {
  plan_runtime=venv
  plan_venv=""
  plan_container=""
  plan_requirements_digest=""
  plan_venv_held=""
  [[ -z "${opt_setup_venv:-}" ]] || plan_requirements_digest=$(sha256sum <"$opt_setup_venv" | cut -d' ' -f1)
  if [[ -n "${opt_container:-}" ]]; then
    plan_runtime=singularity
    plan_container=$(realpath -e -- "$opt_container") || usage_error "cannot resolve '$opt_container'"
  fi
  if [[ -n "${opt_venv:-}" ]]; then
    plan_venv=$(realpath -m -- "$opt_venv") || usage_error "cannot resolve --venv '$opt_venv'"
  elif [[ -n "${opt_setup_venv:-}" ]]; then
    plan_venv="$source_dir/.venv"
  elif [[ "$plan_runtime" == venv && -x "$source_dir/.venv/bin/python" ]]; then
    plan_venv="$source_dir/.venv"
  fi
  [[ -z "$plan_venv" ]] || plan_venv_held=$(cat "$(venv_stamp "$plan_venv")" 2>/dev/null) || plan_venv_held=""
  plan_venv_digest=${plan_requirements_digest:-$plan_venv_held}
}

# data_tarball_name DIGEST COMPRESS: the cached data tarball's file name
# (DIGEST '*': the pattern of every such name for COMPRESS).
data_tarball_name() {
  local suffix=""
  case "$2" in
    zstd) suffix=".zst" ;;
    pigz) suffix=".gz" ;;
  esac
  printf 'data-%s.tar%s' "$1" "$suffix"
}

# plan_data: the -d paths (sorted, unique) and plan_data_paths_digest, a
# digest of the path list: the first half of their tarballs' names (the
# second, a digest of the contents, is name_data_tarball's in data.sh).
plan_data() {
  local path digest
  plan_data_paths=()
  plan_data_paths_digest=""
  plan_data_tarball=""
  plan_compress=$opt_compress
  ((${#opt_data[@]} > 0)) || return 0
  for path in "${opt_data[@]}"; do
    path=${path%/}
    plan_data_paths+=("${path#./}")
  done
  # One path needs no sort process.
  ((${#plan_data_paths[@]} == 1)) ||
    mapfile -t plan_data_paths < <(printf '%s\n' "${plan_data_paths[@]}" | LC_ALL=C sort -u)
  digest=$(sha256sum < <(printf '%s\0' "${plan_data_paths[@]}"))
  plan_data_paths_digest=${digest:0:16}
}

# plan_array TRIALS [FIRST]: an array job when there is more than one trial
# (a wandb sweep: always). Method bayes: round K's manifest lists rounds
# 1..K (trial = global index, so trials/K folders never collide); its array
# runs this round's tasks only, FIRST..TRIALS-1, even for one trial.
plan_array() {
  local trials=$1 first=${2:-}
  plan_trial_count=$trials
  plan_array_spec=""
  if [[ -n "$first" ]] || ((trials > 1)) || [[ -n "${opt_wandb_sweep:-}" ]]; then
    plan_array_spec="${first:-0}-$((trials - 1))"
    [[ -z "$plan_array_throttle" ]] || plan_array_spec+="%$plan_array_throttle"
    plan_log_name=%x_%A_%a.out
  else
    plan_log_name=%x_%j.out
  fi
  # sbatch reads '%' in --output as a pattern: '%%' is a literal one.
  plan_log_file="${plan_log_dir//%/%%}/$plan_log_name"
}

# plan_array_split: an array above the cluster's MaxArraySize
# (cluster_max_array, validate_array_size) goes as several array jobs of the
# same script, at most that many tasks each (submit_job); the script's own
# --array line is the first's. Sets plan_array_chunk (empty: one array).
plan_array_split() {
  plan_array_chunk=""
  [[ -n "$plan_array_spec" && -n "${cluster_max_array:-}" ]] || return 0
  ((plan_trial_count > cluster_max_array)) || return 0
  [[ -z "${opt_no_submit:-}" ]] ||
    usage_error "--no-submit: these $plan_trial_count trials go as several array jobs (the cluster's MaxArraySize is $cluster_max_array), which one 'sbatch job.sbatch' cannot queue; submit them"
  [[ -z "${opt_wait:-}" ]] ||
    usage_error "--wait follows one job; these $plan_trial_count trials go as several array jobs (the cluster's MaxArraySize is $cluster_max_array): follow them with status.sh"
  plan_array_chunk=$cluster_max_array
  plan_array_spec="0-$((plan_array_chunk - 1))"
  [[ -z "$plan_array_throttle" ]] || plan_array_spec+="%$plan_array_throttle"
}

# plan_submission_folder DIR [PREVIEW]: the folder the job runs from, and
# where its code is: the snapshot inside it, or the live project with
# --no-snapshot. PREVIEW (1): --dry-run, DIR is only a name.
plan_submission_folder() {
  plan_submission_dir=$1
  plan_preview=${2:-}
  plan_snapshot=1
  plan_code_dir="$1/code"
  if [[ -n "${opt_no_snapshot:-}" ]]; then
    plan_snapshot=""
    plan_code_dir=$source_dir
  fi
}
