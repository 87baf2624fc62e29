# shellcheck shell=bash
# Runtime layer, virtualenv flavour: how a command runs inside the project's
# Python environment. A venv, a uv venv or a conda env is used by path
# (HPC_VENV, from --venv or the project's .venv): its bin/ goes first on PATH,
# which is all that 'activate' does that matters here, and which works for the
# three kinds alike. Without HPC_VENV the node's own python is used.
# Sourced by node/launch.sh; defines runtime_exec and runtime_exec_capture.

runtime_env_setup() {
  [[ -n "${HPC_VENV:-}" ]] || return 0
  export PATH="$HPC_VENV/bin:$PATH"
  unset PYTHONHOME
  if [[ -d "$HPC_VENV/conda-meta" ]]; then
    conda_env_setup
  else
    export VIRTUAL_ENV="$HPC_VENV"
  fi
}

# conda_env_setup: what 'conda activate' does besides PATH: CONDA_PREFIX, and
# the env's activation scripts (etc/conda/activate.d/*.sh: packages such as
# cudatoolkit or compilers set their variables there). They are written for
# interactive shells, so they run without -e and -u.
conda_env_setup() {
  local script flags=$-
  export CONDA_PREFIX="$HPC_VENV" CONDA_DEFAULT_ENV="${HPC_VENV##*/}"
  set +eu
  for script in "$HPC_VENV"/etc/conda/activate.d/*.sh; do
    # shellcheck source=/dev/null # the env's own scripts
    [[ -f "$script" ]] && source "$script"
  done
  [[ "$flags" != *e* ]] || set -e
  [[ "$flags" != *u* ]] || set -u
}

# runtime_exec CMD...: replace this shell with CMD inside the environment.
runtime_exec() {
  runtime_env_setup
  exec "$@"
}

# runtime_exec_capture CMD...: run CMD inside the environment and return.
runtime_exec_capture() {
  (
    runtime_env_setup
    "$@"
  )
}
