# shellcheck shell=bash
# Site profiles: one small file per cluster (hpc_files/sites/NAME.conf, or a
# path), chosen by --site or HPC_SITE, never by hostname. Sourced; functions only.
#
# Format: 'key = value' lines. A '#' at the start of a line, or preceded by
# a space or tab, starts a comment (a '#' inside a word, as in a#b, is kept).
# Values are literal: nothing is expanded or evaluated here; each is checked
# by its type when read (site_value_error names file, line, key and what is
# accepted). tmpdir_base may name $USER, expanded on the node; a relative one
# is under the folder of the cluster's slurm.conf (site_tmpdir_base holds it
# resolved). Repeatable keys (env, sbatch, command) accumulate in order.

# key -> "scalar" or "list"
declare -A SITE_KEYS=(
  [account]=scalar            # default --account
  [partition]=scalar          # default --partition
  [modules]=scalar            # modules to 'module load' on the nodes
  [provides_tmpdir]=scalar    # yes: the site sets SLURM_TMPDIR; no: mimic it
  [tmpdir_base]=scalar        # node-local base for the mimic SLURM_TMPDIR (relative: to slurm.conf's folder)
  [gpu_types]=scalar          # allowed --gpu-type values, comma separated
  [max_gpus_per_node]=scalar  # refuse --gpus above this
  [max_cpus_per_node]=scalar  # refuse layouts that need more CPUs per node
  [max_nodes]=scalar          # refuse --num-nodes above this
  [array_throttle]=scalar     # default --array-throttle
  [container_runtime]=scalar  # singularity or apptainer
  [compute_internet]=scalar   # no: --setup-venv builds on the login node
  [wandb_sync]=scalar         # default --wandb-sync (login or none)
  [slurm_conf]=scalar         # SLURM_CONF to use when unset (relative: to the toolkit's folder)
  [env]=list                  # NAME=VALUE exported in the job
  [sbatch]=list               # extra #SBATCH arguments
  [command]=list              # extra shell lines run before the launch
)

# load_site: read the profile named by --site, HPC_SITE or the default into
# site_* variables (the plan takes account, partition, modules and array
# throttle from it where the command line gave none).
load_site() {
  site_name=${opt_site:-${HPC_SITE:-$DEFAULT_SITE}}
  find_site_file "$site_name"
  read_site_file "$site_file"
  use_site_slurm_conf
}

# find_site_file NAME|PATH: the profile's path into site_file (a NAME is
# HPC_SITES_DIR's NAME.conf, else the shipped one); exit 2 when there is no
# readable one.
find_site_file() {
  local mine="${HPC_SITES_DIR:-$HOME/.config/hpc_files/sites}/$1.conf"
  [[ -n "$1" ]] || usage_error "--site expects a name or a file, got ''"
  site_file="$HPC_FILES_DIR/sites/$1.conf"
  if [[ "$1" == */* || "$1" == *.conf ]]; then
    site_file=$1
  elif [[ -f "$mine" ]]; then
    site_file=$mine
  fi
  [[ -f "$site_file" ]] ||
    usage_error "site profile '$1' not found (looked for $site_file; shipped: $(list_shipped_sites))"
  [[ -r "$site_file" ]] || usage_error "site profile $site_file is not readable"
}

# read_site_file FILE: FILE's 'key = value' lines into site_* variables, each
# value checked by its type (exit 2 naming file, line, key and what is
# accepted); keys FILE does not set get their defaults.
read_site_file() {
  local file=$1 line key value number=0
  site_file=$file
  site_env=() site_sbatch=() site_command=()
  for key in "${!SITE_KEYS[@]}"; do
    [[ "${SITE_KEYS[$key]}" == list ]] || printf -v "site_${key}" '%s' ""
  done
  while IFS= read -r line || [[ -n "$line" ]]; do
    number=$((number + 1))
    # The line without its comment (a '#' first on the line or after a space
    # or tab) and without surrounding blanks. The regex is greedy (it finds
    # the last ' #'): cut until none remains.
    line="${line#"${line%%[![:space:]]*}"}"
    [[ "$line" != \#* ]] || line=""
    while [[ "$line" =~ ^(.*[^[:space:]])?[[:space:]]+# ]]; do
      line=${BASH_REMATCH[1]}
    done
    line="${line%"${line##*[![:space:]]}"}"
    [[ -n "$line" ]] || continue
    [[ "$line" == *=* ]] || usage_error "$file:$number: expected 'key = value', got '$line'"
    key="${line%%=*}"
    key="${key%"${key##*[![:space:]]}"}"
    value="${line#*=}"
    value="${value#"${value%%[![:space:]]*}"}"
    [[ "$key" =~ ^[a-z_]+$ && -n "${SITE_KEYS[$key]:-}" ]] ||
      usage_error "$file:$number: unknown key '$key' (known: $(printf '%s\n' "${!SITE_KEYS[@]}" | sort | tr '\n' ' '))"
    site_check_value "$file:$number" "$key" "$value"
    case "$key" in
      env) site_env+=("$value") ;;
      sbatch) site_sbatch+=("$value") ;;
      command) site_command+=("$value") ;;
      max_gpus_per_node | max_cpus_per_node | max_nodes | array_throttle)
        printf -v "site_${key}" '%s' $((10#$value)) ;;
      *) printf -v "site_${key}" '%s' "$value" ;;
    esac
  done <"$file"
  : "${site_provides_tmpdir:=auto}"
  : "${site_compute_internet:=yes}"
  : "${site_tmpdir_base:=/tmp}"
  site_resolve_tmpdir_base
}

# site_resolve_tmpdir_base: a relative tmpdir_base made absolute under the
# folder of the cluster's slurm.conf (SLURM_CONF, else the profile's
# slurm_conf), each leading '../' taking one folder off: a local cluster's
# mimic folders then live in that cluster's own folder, so two clusters on one
# machine (both with a job 1) never meet there.
site_resolve_tmpdir_base() {
  local base=$site_tmpdir_base conf dir
  [[ "$base" != /* ]] || return 0
  conf=$(site_slurm_conf_path)
  [[ -n "$conf" ]] ||
    usage_error "$site_file: tmpdir_base '$base' is relative to the folder of the cluster's slurm.conf, but neither SLURM_CONF nor the profile's slurm_conf names one"
  dir=${conf%/*}
  while [[ "$base" == ../* ]]; do
    dir=${dir%/*}
    base=${base#../}
  done
  base=${base#./}
  site_tmpdir_base="${dir:-}/$base"
}

# site_value_error WHERE KEY VALUE ACCEPTED: exit 2 naming all four.
site_value_error() {
  usage_error "$1: $2 expects $4, got '$3'"
}

# site_check_value WHERE KEY VALUE: refuse a value that is not of KEY's type.
# Values are only matched against patterns, never evaluated.
site_check_value() {
  local where=$1 key=$2 value=$3 stripped owner
  case "$key" in
    max_gpus_per_node | max_cpus_per_node | max_nodes | array_throttle)
      [[ "$value" =~ ^[0-9]{1,9}$ ]] || site_value_error "$where" "$key" "$value" "a whole number"
      # The default of --array-throttle: what that option accepts.
      [[ "$key" != array_throttle ]] || ((10#$value >= 1 && 10#$value <= 100000)) ||
        site_value_error "$where" "$key" "$value" "a whole number from 1 to 100000"
      ;;
    provides_tmpdir)
      [[ "$value" =~ ^(yes|no|auto)$ ]] || site_value_error "$where" "$key" "$value" "yes, no or auto"
      ;;
    compute_internet)
      [[ "$value" =~ ^(yes|no)$ ]] || site_value_error "$where" "$key" "$value" "yes or no"
      ;;
    wandb_sync)
      [[ "$value" =~ ^(login|none)$ ]] || site_value_error "$where" "$key" "$value" "login or none"
      ;;
    container_runtime)
      [[ "$value" =~ ^(singularity|apptainer)$ ]] ||
        site_value_error "$where" "$key" "$value" "singularity or apptainer"
      ;;
    account)
      [[ "$value" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] ||
        site_value_error "$where" "$key" "$value" "names of letters, digits, '.', '_' and '-' (one account)"
      ;;
    partition | gpu_types)
      [[ "$value" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*(,[A-Za-z0-9_][A-Za-z0-9._-]*)*$ ]] ||
        site_value_error "$where" "$key" "$value" "names of letters, digits, '.', '_' and '-', separated by commas"
      ;;
    modules)
      [[ "$value" =~ ^[A-Za-z0-9_./+-]+([[:space:]]+[A-Za-z0-9_./+-]+)*$ ]] ||
        site_value_error "$where" "$key" "$value" "module names (letters, digits, '_', '.', '/', '+', '-') separated by spaces"
      ;;
    tmpdir_base)
      stripped=${value//\$\{USER\}/}
      stripped=${stripped//\$USER/}
      [[ "$stripped" =~ ^[A-Za-z0-9_./+@:\ -]+$ ]] ||
        site_value_error "$where" "$key" "$value" "a path of letters, digits, spaces and '_./+@:-', which may name \$USER (relative: to slurm.conf's folder)"
      ;;
    slurm_conf)
      [[ "$value" =~ ^[A-Za-z0-9_./+@:\ -]+$ ]] ||
        site_value_error "$where" "$key" "$value" "a path of letters, digits, spaces and '_./+@:-' (relative: to the toolkit's folder)"
      ;;
    env)
      [[ "$value" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
        site_value_error "$where" "$key" "$value" "NAME=value with NAME of letters, digits and '_' (not a digit first)"
      ;;
    sbatch)
      [[ "$value" == -* ]] || site_value_error "$where" "$key" "$value" "an sbatch option starting with '-'"
      owner=$(sbatch_option_owner "$value")
      case "$owner" in # the profile's own key first
        *-p/--partition*) owner="use 'partition = NAME' in the profile, or -p/--partition" ;;
        *-a/--account*) owner="use 'account = NAME' in the profile, or -a/--account" ;;
      esac
      [[ -z "$owner" ]] ||
        site_value_error "$where" "$key" "$value" "an sbatch option the submitter does not set itself ($owner)"
      ;;
  esac
}

# site_env_names: the names the env lines set, once each, space separated
# (for HPC_PASS_ENV: a container gets only the variables it is given).
site_env_names() {
  local entry names=" "
  for entry in ${site_env[@]+"${site_env[@]}"}; do
    [[ "$names" == *" ${entry%%=*} "* ]] || names+="${entry%%=*} "
  done
  names=${names# }
  printf '%s' "${names% }"
}

list_shipped_sites() {
  local f names=""
  for f in "$HPC_FILES_DIR"/sites/*.conf; do
    [[ -e "$f" ]] || continue
    f=${f##*/}
    names+="${names:+, }${f%.conf}"
  done
  printf '%s' "$names"
}

# use_site_slurm_conf: export the site's slurm_conf as SLURM_CONF when none is
# set and the file exists (the local cluster: sbatch, squeue and scontrol find
# it without 'export SLURM_CONF=...'). A SLURM_CONF already set wins.
use_site_slurm_conf() {
  local conf
  [[ -n "${site_slurm_conf:-}" && -z "${SLURM_CONF:-}" ]] || return 0
  conf=$(site_slurm_conf_path)
  [[ -f "$conf" ]] || return 0
  export SLURM_CONF="$conf"
}

# site_slurm_conf_path: the slurm.conf this submission talks to: SLURM_CONF,
# else the profile's slurm_conf (relative: to the toolkit's folder), else ''.
# A relative SLURM_CONF is the current directory's, as SLURM reads it.
site_slurm_conf_path() {
  local conf=${SLURM_CONF:-} base=$PWD
  if [[ -z "$conf" ]]; then
    conf=${site_slurm_conf:-}
    base=${HPC_FILES_DIR%/*}
  fi
  [[ -z "$conf" || "$conf" == /* ]] || conf="$base/$conf"
  printf '%s' "$conf"
}
