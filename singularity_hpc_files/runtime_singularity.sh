# shellcheck shell=bash
# Runtime layer, container flavour: how a command runs inside a Singularity or
# Apptainer image (HPC_CONTAINER, from -s). The container starts from a clean
# environment (--cleanenv) and gets exactly the variables the job needs
# through SINGULARITYENV_/APPTAINERENV_ variables: never on the command line,
# so no secret (WANDB_API_KEY) ever appears in a process's argv. The project,
# scratch and SLURM_TMPDIR are bound at the same paths; --nv when the job has
# GPUs. Multi-node works like the venv: torchrun or srun tasks each start
# their own container on their node.
# Sourced by node/launch.sh; defines runtime_exec and runtime_exec_capture.

# Which variables cross into the container (names or name prefixes*).
RUNTIME_PASS_VARIABLES=(SLURM_* SLURMD_* SRUN_* MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE
  HPC_* CUDA_VISIBLE_DEVICES NCCL_* WANDB_* OMP_NUM_THREADS TORCH_* PYTHONUNBUFFERED
  PYTHONFAULTHANDLER source_dir project_name scratch_dir exp_name SCRATCH USER HOME)

container_command() {
  if [[ -n "${HPC_CONTAINER_RUNTIME:-}" ]]; then
    printf '%s' "$HPC_CONTAINER_RUNTIME"
  elif command -v apptainer >/dev/null 2>&1; then
    printf apptainer
  else
    printf singularity
  fi
}

# pass_to_container NAME VALUE [EXPANDED]: NAME=VALUE inside the container.
# Apptainer and Singularity 3.8.1+ evaluate a passed value in the container's
# shell, inside double quotes (which they escape): '\', '$' and '`' are escaped
# here so VALUE arrives as it is, not expanded or run there; EXPANDED follows
# it unescaped, for the container's shell to expand. (3.6 to 3.8.0 quoted it
# with Go's %q, doubling a backslash: a value with '\' or '$' arrives changed.)
pass_to_container() {
  local value=${2//\\/\\\\}
  value=${value//\$/\\\$}
  value=${value//\`/\\\`}${3:-}
  export "SINGULARITYENV_$1=$value" "APPTAINERENV_$1=$value"
}

# Besides those: every name in HPC_PASS_ENV (space separated): the site
# profile's env names and an experiment line's NAME=value prefixes.
export_container_environment() {
  local pattern name
  local -a pass_names=()
  # The code the job runs first on PYTHONPATH, as the batch script puts it for
  # a venv (--cleanenv drops that one): else a 'python scripts/x.py' imports
  # the project's package from the image or an editable install under $HOME,
  # not from the snapshot. The '$PYTHONPATH' left unescaped is the image's own
  # (none: no empty entry, which Python reads as the working folder).
  if [[ -n "${source_dir:-}" ]]; then
    # shellcheck disable=SC2016 # expanded in the container, by its shell
    pass_to_container PYTHONPATH "$source_dir" '${PYTHONPATH:+:$PYTHONPATH}'
  fi
  read -r -a pass_names <<<"${HPC_PASS_ENV:-}"
  for name in ${pass_names[@]+"${pass_names[@]}"}; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ && -n "${!name+set}" ]] || continue
    pass_to_container "$name" "${!name}"
  done
  for pattern in "${RUNTIME_PASS_VARIABLES[@]}"; do
    for name in $(compgen -v); do
      # shellcheck disable=SC2053 # pattern matching on purpose (SLURM_* etc.)
      [[ "$name" == $pattern ]] || continue
      [[ "$name" != SINGULARITYENV_* && "$name" != APPTAINERENV_* ]] || continue
      pass_to_container "$name" "${!name}"
    done
  done
}

container_argv() {
  local path
  container_args=(exec --cleanenv)
  ((${HPC_GPUS_PER_NODE:-0} > 0)) && container_args+=(--nv)
  for path in "${source_dir:-}" "${scratch_dir:-}" "${SLURM_TMPDIR:-}" "${HPC_SUBMISSION_DIR:-}"; do
    [[ -n "$path" && -d "$path" ]] && container_args+=(--bind "$path")
  done
  container_args+=(--pwd "${source_dir:-/}" "$HPC_CONTAINER")
}

runtime_exec() {
  local runtime
  runtime=$(container_command)
  export_container_environment
  container_argv
  exec "$runtime" "${container_args[@]}" "$@"
}

runtime_exec_capture() {
  (
    local runtime
    runtime=$(container_command)
    export_container_environment
    container_argv
    "$runtime" "${container_args[@]}" "$@"
  )
}
