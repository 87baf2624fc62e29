# shellcheck shell=bash
# Messages and small helpers shared by every step of job_submitter.sh.
# Sourced; defines functions only.

# What the compute nodes read too (job states, the tarball's .meta): in
# node/, which every submission folder copies.
# shellcheck source=../node/shared.sh
source "${BASH_SOURCE[0]%/*}/../node/shared.sh"

# One prefix for every message on stderr.
HPC_PROG="${HPC_PROG:-job_submitter.sh}"

# one_line TEXT: TEXT with newlines, carriage returns and tabs shown as \n,
# \r, \t, so a message quoting a hostile value stays one line.
one_line() {
  local text="$*"
  text=${text//$'\n'/\\n}
  text=${text//$'\r'/\\r}
  text=${text//$'\t'/\\t}
  printf '%s' "$text"
}

# error_line MESSAGE...: the line usage_error and die print, on stdout.
error_line() {
  printf '%s: error: %s\n' "$HPC_PROG" "$(one_line "$*")"
}

# usage_error MESSAGE: bad input from the user; nothing was submitted. Exit 2.
usage_error() {
  error_line "$@" >&2
  exit 2
}

# die MESSAGE: a runtime failure (a command failed, a file could not be written). Exit 1.
die() {
  error_line "$@" >&2
  exit 1
}

warn() {
  printf '%s: warning: %s\n' "$HPC_PROG" "$*" >&2
}

info() {
  printf '%s: %s\n' "$HPC_PROG" "$*" >&2
}

# shell_quote WORD...: each word quoted for a shell, joined by spaces. Unlike
# printf %q it keeps printable text readable ('a b' rather than a\ b) and is
# stable across bash versions, which the golden files need.
shell_quote() {
  local word out="" sep="" quote="'" escaped="'\\''"
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then
      out+="$sep$word"
    else
      # Outside double quotes and with quoted operands, this replacement
      # means the same on bash 4.2 as on 4.3+ (where a double-quoted one differs).
      word=${word//"$quote"/"$escaped"}
      out+="$sep'$word'"
    fi
    sep=" "
  done
  printf '%s' "$out"
}

# is_uint VALUE: a whole number (no sign, no spaces, not empty).
is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

# Temporary files removed when job_submitter.sh exits, whatever the outcome.
HPC_CLEANUP_PATHS=()

register_cleanup() {
  HPC_CLEANUP_PATHS+=("$1")
}

# make_work_dir: this run's private temporary folder (work_dir), made at the
# first call and removed on exit. The steps name their files in it: one
# mktemp a submission, not one a file.
make_work_dir() {
  [[ -z "${work_dir:-}" ]] || return 0
  work_dir=$(mktemp -d "${TMPDIR:-/tmp}/hpc-submit.XXXXXX") || die "mktemp failed"
  register_cleanup "$work_dir"
}

# Processes a submission runs in the background while it goes on (trials.py,
# the questions to SLURM, the git state), by name; each one's pid is in
# background_pid_NAME. (No associative array: bash 4.2 loses the elements
# of one declared -gA in a function, as a sourced file in a test is.)
HPC_BACKGROUND=()

# start_background NAME COMMAND...: COMMAND in the background as NAME (its
# redirections are the caller's: 'start_background NAME cmd >file' sends
# the background command's output there).
start_background() {
  local name=$1
  shift
  "$@" &
  printf -v "background_pid_$name" '%s' "$!"
  HPC_BACKGROUND+=("$name")
}

# await NAME: waits for the background process NAME; returns its status
# (127 when none of that name is running).
await() {
  local var="background_pid_$1" pid
  pid=${!var:-}
  [[ -n "$pid" ]] || return 127
  unset "$var"
  wait "$pid"
}

# await_or_exit NAME: waits for the background process NAME, whose stderr
# went to $work_dir/NAME.stderr, and prints that; exits as NAME did when it
# failed (its own message says why).
await_or_exit() {
  local status=0
  await "$1" || status=$?
  [[ ! -s "$work_dir/$1.stderr" ]] || cat -- "$work_dir/$1.stderr" >&2
  ((status == 0)) || exit "$status"
}

# await_answer NAME: waits for the background question NAME (ask_slurm,
# ask_queue), whose answer is then in the file $work_dir/answer.NAME. Fails,
# the file emptied, when it gave no answer.
await_answer() {
  await "$1" && return 0
  : >"$work_dir/answer.$1"
  return 1
}

# stop_background: on exit, the background processes still running (a check
# refused the submission meanwhile) end before the cleanup removes the
# folders they write into. One that has ended already is only waited for.
stop_background() {
  local name var
  # bash 4.2 calls an empty array unbound under set -u.
  ((${#HPC_BACKGROUND[@]} > 0)) || return 0
  for name in "${HPC_BACKGROUND[@]}"; do
    var="background_pid_$name"
    [[ -n "${!var:-}" ]] || continue
    kill "${!var}" 2>/dev/null || :
    wait "${!var}" 2>/dev/null || :
    unset "$var"
  done
  HPC_BACKGROUND=()
}

run_cleanup() {
  ((${#HPC_CLEANUP_PATHS[@]} == 0)) || rm -rf -- "${HPC_CLEANUP_PATHS[@]}"
}

# project_paths: where the project is (source_dir, project_name): the folder
# holding hpc_files/ (HPC_FILES_DIR is absolute, as 'cd DIR && pwd' prints it).
project_paths() {
  source_dir=${HPC_FILES_DIR%/*}
  : "${source_dir:=/}"
  project_name=${source_dir##*/}
}

# login_python: the python that runs the login-node tools (hpc_files/hpc_tools/):
# HPC_PYTHON, else the --venv's, else the project's .venv, else python3.
login_python() {
  if [[ -n "${HPC_PYTHON:-}" ]]; then
    printf '%s' "$HPC_PYTHON"
  elif [[ -n "${opt_venv:-}" && -x "$opt_venv/bin/python" ]]; then
    printf '%s' "$opt_venv/bin/python"
  elif [[ -x "$source_dir/.venv/bin/python" ]]; then
    printf '%s' "$source_dir/.venv/bin/python"
  else
    printf '%s' python3
  fi
}

# hpc_tools_path: the PYTHONPATH of 'python -m hpc_tools.MODULE': hpc_files/
# (the package's folder) first, then the caller's own.
hpc_tools_path() {
  printf '%s' "$HPC_FILES_DIR${PYTHONPATH:+:$PYTHONPATH}"
}

# run_results_py MODE ARG...: status.sh and results.sh, whose work and help
# (-h, --help) are hpc_tools.results MODE's, for this project (project_paths).
run_results_py() {
  local mode=$1
  shift
  project_paths
  PYTHONPATH=$(hpc_tools_path) exec "$(login_python)" -m hpc_tools.results "$mode" --project "$project_name" "$@"
}

# The long sbatch options the submitter sets itself (sbatch_option_owner).
SBATCH_OWNED_LONG=(--nodes --ntasks --ntasks-per-node --ntasks-per-gpu --cpus-per-task
  --cpus-per-gpu --gres --gpus --gpus-per-node --gpus-per-task --gpus-per-socket
  --tres-per-task --mem --mem-per-cpu --mem-per-gpu --partition --account --time
  --requeue --no-requeue --signal --dependency --array --job-name --output --error
  --open-mode --export)

# sbatch_option_name ARG: the option ARG sets, as sbatch reads it ('-N2',
# '-N 2', '--nodes=2' and '--node 2' all set --nodes): sbatch (getopt_long)
# takes an unambiguous prefix of a long option, so a long name that is not an
# owned one but a prefix of one counts as it (a prefix of others too is
# refused by sbatch anyway).
sbatch_option_name() {
  local name long
  if [[ "$1" == --* ]]; then
    name=${1%%[= ]*}
  else
    name=${1:0:2}
  fi
  case "$name" in
    -N) name=--nodes ;;
    -n) name=--ntasks ;;
    -c) name=--cpus-per-task ;;
    -G) name=--gpus ;;
    -p) name=--partition ;;
    -A) name=--account ;;
    -t) name=--time ;;
    -d) name=--dependency ;;
    -a) name=--array ;;
    -J) name=--job-name ;;
    -o) name=--output ;;
    -e) name=--error ;;
    --?*)
      if [[ " ${SBATCH_OWNED_LONG[*]} " != *" $name "* ]]; then
        for long in "${SBATCH_OWNED_LONG[@]}"; do
          [[ "$long" != "$name"* ]] || {
            name=$long
            break
          }
        done
      fi
      ;;
  esac
  printf '%s' "$name"
}

# sbatch_option_value ARG: the value ARG gives its option ('2' for '-N2',
# '-N 2', '--nodes=2' and '--nodes 2'; '' for a flag).
sbatch_option_value() {
  local value
  if [[ "$1" == --* ]]; then
    value=${1#"${1%%[= ]*}"}
  else
    value=${1:2}
  fi
  printf '%s' "${value#[= ]}"
}

# sbatch_option_owner ARG: for an sbatch option the submitter sets itself (on
# sbatch's command line, where it beats an #SBATCH line that a later 'sbatch
# job.sbatch' would obey instead, or in the script's own lines for the log, the
# array and the layout, where a later line of the same option wins and the job
# would run another layout than the one its HPC_* settings describe), the
# submitter's way to ask for it; nothing for any other option.
sbatch_option_owner() {
  local name value
  name=$(sbatch_option_name "$1")
  value=$(sbatch_option_value "$1")
  case "$name" in
    --nodes) printf 'use -N/--nodes' ;;
    --ntasks | --ntasks-per-node | --ntasks-per-gpu) printf 'the tasks follow --gpus and -W (with --gpus 0: --tasks-per-node)' ;;
    --cpus-per-task | --cpus-per-gpu) printf 'use -c/--cpus' ;;
    --gres | --tres-per-task) [[ "$value" != *gpu* ]] || printf 'use -g/--gpus and -G/--gpu-type' ;; # another gres: plan_resource_lines
    --gpus | --gpus-per-node | --gpus-per-task | --gpus-per-socket) printf 'use -g/--gpus and -G/--gpu-type' ;;
    --mem-per-cpu | --mem-per-gpu) printf 'use -m/--mem-per-gpu, or --mem=SIZE for the memory per node' ;; # --mem: plan_resource_lines
    --partition) printf 'use -p/--partition' ;;
    --account) printf 'use -a/--account' ;;
    --time) printf 'use -t/--time' ;;
    --requeue | --no-requeue) printf 'use --max-requeues or --no-signal' ;;
    --signal) printf 'use --signal, --signal-lead or --no-signal' ;;
    --dependency) printf 'use --dependency' ;;
    --array) printf 'use --sweep, --seeds, -C or --array-throttle' ;;
    --job-name) printf 'use -e/--exp-name' ;;
    --output | --error | --open-mode) printf "the log is the submitter's: one per task, appended across requeues" ;;
    --export) printf "the job needs the submitting shell's environment (--export=ALL)" ;;
  esac
}

# The owned options whose value the plan compares with its own (an
# --sbatch-arg that repeats it is accepted: plan_repeated_options).
SBATCH_PLANNED=(--nodes --ntasks --ntasks-per-node --cpus-per-task --partition --account --job-name)

# sbatch_option_planned ARG: ARG sets one of SBATCH_PLANNED.
sbatch_option_planned() {
  local name
  name=$(sbatch_option_name "$1")
  [[ " ${SBATCH_PLANNED[*]} " == *" $name "* ]]
}
