# shellcheck shell=bash
# Runtime layer, virtualenv flavour: how a command runs inside the project's
# Python environment. A venv, a uv venv or a conda env is used by path
# (HPC_VENV, from --venv or the project's .venv): its bin/ goes first on PATH,
# which is all that 'activate' does that matters here, and which works for the
# three kinds alike. Without HPC_VENV the node's own python is used.
# Sourced by node/launch.sh; defines runtime_exec and runtime_exec_capture.

runtime_env_setup() {
  [[ -n "${HPC_VENV:-}" ]] || return 0
  export VIRTUAL_ENV="$HPC_VENV"
  export PATH="$HPC_VENV/bin:$PATH"
  unset PYTHONHOME
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
