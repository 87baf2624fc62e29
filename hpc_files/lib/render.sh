# shellcheck shell=bash
# Rendering: the batch script as a pure function of the plan (plan_*, and
# nothing else). It reads no clock and runs no command (printf only), so
# --dry-run is byte-stable and golden files can test it;
# what varies (job id, node names, the submission folder) is resolved on the
# node. Sourced; functions only.

# sbatch_line ARG: one '#SBATCH' line; sbatch honours double quotes there.
# A value with spaces is quoted, given as '--opt=a b', '--opt a b' or '-o a'.
sbatch_line() {
  local arg=$1 name
  if [[ "$arg" != *[[:space:]]* ]]; then
    printf '#SBATCH %s\n' "$arg"
    return 0
  fi
  name=${arg%%[=[:space:]]*}
  arg=${arg#"$name"}
  arg=${arg#[=[:space:]]}
  # sbatch reads a short option's value from the next word ('-w=node1' would
  # name the node '=node1').
  if [[ "$name" == -[!-]* ]]; then
    printf '#SBATCH %s "%s"\n' "$name" "$arg"
  else
    printf '#SBATCH %s="%s"\n' "$name" "$arg"
  fi
}

# export_line NAME VALUE: an export with the value quoted literally.
export_line() {
  printf 'export %s=' "$1"
  shell_quote "$2"
  printf '\n'
}

render_header() {
  local kind_text array_note=""
  case "$plan_kind" in
    lightning) kind_text="lightning: one task per GPU, all started by one srun" ;;
    torchrun) kind_text="torchrun: one task per node, each starting $plan_procs_per_node process(es)" ;;
    none) kind_text="none: one process, no distributed launcher" ;;
  esac
  [[ -z "$plan_array_spec" ]] || array_note=' (array task K runs line K+1 of commands.txt)'
  [[ -z "${plan_array_chunk:-}" ]] ||
    array_note=" (arrays of at most $plan_array_chunk tasks, the cluster's MaxArraySize: task K of the one from trial F, HPC_TRIAL_OFFSET, runs line F+K+1 of commands.txt)"
  printf '#!/bin/bash\n'
  if [[ -n "$plan_preview" ]]; then
    printf '# Preview (--dry-run): nothing was written or submitted, and the submission\n'
    printf '# folder named below does not exist; --no-submit writes it with this script.\n'
  fi
  printf '# Rendered by hpc_files/job_submitter.sh %s; do not edit: re-run the\n' "$HPC_VERSION"
  printf '# submitter (its exact command is in command.txt beside this file).\n#\n'
  printf '# Layout: %s node(s) x %s task(s) x %s CPU(s); world size %s.\n' \
    "$plan_nodes" "$plan_tasks_per_node" "$plan_cpus_per_task" "$plan_world_size"
  printf '# Kind: %s.\n# Trials: %s%s.\n' "$kind_text" "$plan_trial_count" "$array_note"
}

# resource_options: the allocation a run of the plan asks for, the batch
# script's and --interactive's salloc alike, into resource_args.
resource_options() {
  resource_args=("--job-name=$plan_job_name")
  [[ -z "$plan_account" ]] || resource_args+=("--account=$plan_account")
  [[ -z "$plan_partition" ]] || resource_args+=("--partition=$plan_partition")
  resource_args+=("--nodes=$plan_nodes" "--ntasks-per-node=$plan_tasks_per_node" "--cpus-per-task=$plan_cpus_per_task")
  [[ -z "$plan_gres" ]] || resource_args+=("--gres=$plan_gres")
  resource_args+=("--mem=$plan_mem" "--time=$plan_time")
}

render_sbatch_lines() {
  local arg
  local -a resource_args
  printf '\n# Resources.\n'
  resource_options
  for arg in "${resource_args[@]}"; do
    sbatch_line "$arg"
  done
  if [[ -n "$plan_signal" ]]; then
    printf '# One log per job (array: per task), appended to across requeues; %s to\n' "$plan_signal"
    printf '# this script %s s before the wall time: checkpoint, then requeue.\n' "$plan_signal_lead"
  else
    printf '# One log per job (array: per task), appended to across requeues; no\n'
    printf '# wall-time signal (--no-signal): the program runs until the wall time.\n'
  fi
  sbatch_line "--output=$plan_log_file"
  for arg in "${plan_requeue_args[@]}"; do
    sbatch_line "$arg"
  done
  if [[ -n "$plan_array_spec" ]]; then
    printf '# One array task per trial.\n'
    sbatch_line "--array=$plan_array_spec"
  fi
  [[ -z "$plan_dependency" ]] || sbatch_line "--dependency=$plan_dependency"
  render_site_sbatch_lines
}

# render_account_lines: --account and --partition, when given (or the site's).
render_account_lines() {
  [[ -z "$plan_account" ]] || sbatch_line "--account=$plan_account"
  [[ -z "$plan_partition" ]] || sbatch_line "--partition=$plan_partition"
}

# render_site_sbatch_lines: the site profile's sbatch lines and --sbatch-arg.
render_site_sbatch_lines() {
  local arg
  ((${#plan_sbatch_args[@]} > 0)) || return 0
  printf '# From the site profile and --sbatch-arg.\n'
  for arg in "${plan_sbatch_args[@]}"; do
    sbatch_line "$arg"
  done
}

render_environment() {
  local entry
  # shellcheck disable=SC2016 # the job expands these variables, not the submitter
  printf '%s\n' '' 'set -uo pipefail' \
    '# A job sbatch-ed from an empty environment (env -i) has no HOME or USER.' \
    'export HOME=${HOME:-~} USER="${USER:-$(id -un)}"' \
    '# srun does not inherit --cpus-per-task since SLURM 22.05.' \
    'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"' '' \
    '# The project and its folders, for the node scripts and the program.'
  export_line source_dir "$plan_code_dir"
  export_line project_name "$plan_project_name"
  export_line scratch_dir "$plan_scratch_dir"
  export_line exp_name "$plan_exp_name"
  if [[ -n "$plan_snapshot" ]]; then
    printf '# The code as submitted (a snapshot of the project; git.txt says which\n'
    printf '# commit): the program runs there, and imports from the project find it first.\n'
    printf 'export PYTHONPATH='
    shell_quote "$plan_code_dir"
    # shellcheck disable=SC2016 # the job expands its own PYTHONPATH
    printf '"${PYTHONPATH:+:$PYTHONPATH}"\n'
  fi
  printf '# This script'"'"'s submission folder: node scripts, commands, runs.\n'
  export_line HPC_SUBMISSION_DIR "$plan_submission_dir"
  printf '\n# Toolkit settings, read by node/*.sh.\n'
  export_line HPC_KIND "$plan_kind"
  export_line HPC_NODES "$plan_nodes"
  export_line HPC_GPUS_PER_NODE "$plan_gpus_per_node"
  export_line HPC_PROCS_PER_NODE "$plan_procs_per_node"
  export_line HPC_SIGNAL "$plan_signal"
  export_line HPC_SIGNAL_LEAD "$plan_signal_lead"
  export_line HPC_MAX_REQUEUES "$plan_max_requeues"
  export_line HPC_TMPDIR_MODE "$plan_tmpdir_mode"
  # shellcheck disable=SC2016 # a literal $USER in the comment, for the reader
  printf 'export HPC_TMPDIR_BASE="%s"  # may name $USER\n' "$plan_tmpdir_base"
  export_line HPC_RUNTIME "$plan_runtime"
  [[ -z "$plan_venv" ]] || export_line HPC_VENV "$plan_venv"
  [[ -z "$plan_venv_digest" ]] || export_line HPC_VENV_DIGEST "$plan_venv_digest"
  if [[ "$plan_runtime" == singularity ]]; then
    export_line HPC_CONTAINER "$plan_container"
    export_line HPC_CONTAINER_RUNTIME "$plan_container_runtime"
  fi
  [[ -z "$plan_data_tarball" ]] || export_line HPC_DATA_TARBALL "$plan_data_tarball"
  [[ "$plan_compress" == none ]] || export_line HPC_COMPRESS "$plan_compress"
  [[ -z "$plan_stage_out" ]] || export_line HPC_STAGE_OUT "$plan_stage_out"
  [[ -z "$plan_pass_local_rank" ]] || export_line HPC_PASS_LOCAL_RANK "$plan_pass_local_rank"
  if ((${#plan_env[@]} > 0)); then
    printf "\n# Site '%s': environment (a container gets these names too).\n" "$plan_site_name"
    for entry in "${plan_env[@]}"; do
      export_line "${entry%%=*}" "${entry#*=}"
    done
    export_line HPC_PASS_ENV "$plan_pass_env"
  fi
  render_wandb_sync
  if [[ -n "$plan_modules" ]]; then
    printf '\n# Environment modules (Lmod or Environment Modules).\n'
    printf 'module load %s || { echo "hpc: error: module load %s failed" >&2; exit 1; }\n' "$plan_modules" "$plan_modules"
  fi
  if ((${#plan_site_commands[@]} > 0)); then
    printf "\n# Site '%s': commands.\n" "$plan_site_name"
    printf '%s\n' "${plan_site_commands[@]}"
  fi
}

# render_wandb_sync: --wandb-sync login, after the site's env so that it wins:
# W&B offline (the nodes cannot reach it) and the trigger folder the harness
# (or the program's own wandb_osh hook) writes to after each log.
render_wandb_sync() {
  [[ -n "$plan_wandb_sync_dir" ]] || return 0
  printf '\n# --wandb-sync login: W&B runs offline; after each log the program leaves a\n'
  printf '# wandb-osh trigger here, which hpc_files/wandb_sync.sh syncs from the login node.\n'
  export_line WANDB_MODE offline
  export_line HPC_WANDB_SYNC_DIR "$plan_wandb_sync_dir"
  printf '# wandb writes a running run to its files every 15 s by default; the syncer\n'
  printf '# uploads what is written.\n'
  export_line WANDB__TRANSACTION_LOG_FLUSH_INTERVAL 2
}

render_launch() {
  # shellcheck disable=SC2016 # the job expands these variables, not the submitter
  printf '%s\n' '' \
    '# Stage data, launch, forward signals, requeue: node/batch.sh, copied into the' \
    '# submission folder when it was written, so editing the project later changes' \
    "# nothing queued. exec keeps this shell's pid, which SLURM signals." \
    'if [[ ! -f "$HPC_SUBMISSION_DIR/node/batch.sh" ]]; then' \
    '  echo "hpc: error: no submission folder at $HPC_SUBMISSION_DIR (a --dry-run preview has none; job_submitter.sh --no-submit writes one)" >&2' \
    '  exit 1' \
    'fi' \
    'exec bash "$HPC_SUBMISSION_DIR/node/batch.sh"'
}

# render_setup_script: the venv setup job of --setup-venv (setup.sbatch): one
# task on one node with the training job's CPUs and wall time, account,
# partition, site and --sbatch-arg lines, and its environment (modules, the
# site's env and commands), so it builds with the python the job will use.
render_setup_script() {
  printf '#!/bin/bash\n'
  printf '# The venv setup job of a submission (--setup-venv); rendered by\n'
  printf '# hpc_files/job_submitter.sh %s. The training job waits for it (afterok).\n' "$HPC_VERSION"
  printf '\n# Resources.\n'
  sbatch_line "--job-name=${plan_job_name}_setup_venv"
  render_account_lines
  sbatch_line --nodes=1
  sbatch_line --ntasks=1
  sbatch_line "--cpus-per-task=$plan_cpus_per_task"
  sbatch_line "--mem=$plan_mem"
  sbatch_line "--time=$plan_time"
  sbatch_line "--output=${plan_log_file%/*}/%x_%j.out"
  render_site_sbatch_lines
  render_environment
  printf '\n# What to install, and the digest the venv is stamped with.\n'
  export_line HPC_REQUIREMENTS "$plan_submission_dir/requirements.txt"
  export_line HPC_REQUIREMENTS_DIGEST "$plan_requirements_digest"
  # shellcheck disable=SC2016 # the job expands it, not the submitter
  printf '%s\n' 'exec bash "$HPC_SUBMISSION_DIR/node/setup_venv.sh"'
}

# render_script: the whole batch script on stdout.
render_script() {
  render_header
  render_sbatch_lines
  render_environment
  render_launch
}
