# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034/SC2154: the opt_*, site_* and plan_* variables are shared by the
# libraries that job_submitter.sh sources together; shellcheck -x on
# job_submitter.sh checks them as a whole.)
# Site profiles: one small file per cluster (hpc_files/sites/NAME.conf, or a
# path), chosen by --site or HPC_SITE, never by hostname. Sourced; functions only.
#
# Format: 'key = value' lines; '#' starts a comment line. Values are literal
# (nothing is expanded here); tmpdir_base may name $USER, expanded on the node.
# Repeatable keys (env, sbatch, command) accumulate in order.

# key -> "scalar" or "list"
declare -A SITE_KEYS=(
  [account]=scalar            # default --account
  [partition]=scalar          # default --partition
  [modules]=scalar            # modules to 'module load' on the nodes
  [provides_tmpdir]=scalar    # yes: the site sets SLURM_TMPDIR; no: mimic it
  [tmpdir_base]=scalar        # node-local base for the mimic SLURM_TMPDIR
  [gpu_types]=scalar          # allowed --gpu-type values, comma separated
  [max_gpus_per_node]=scalar  # refuse --gpus above this
  [max_cpus_per_node]=scalar  # refuse layouts that need more CPUs per node
  [max_nodes]=scalar          # refuse --num-nodes above this
  [array_throttle]=scalar     # default --array-throttle
  [container_runtime]=scalar  # singularity or apptainer
  [env]=list                  # NAME=VALUE exported in the job
  [sbatch]=list               # extra #SBATCH arguments
  [command]=list              # extra shell lines run before the launch
)

site_name=""
site_file=""
site_env=()
site_sbatch=()
site_command=()

# resolve_site_file NAME|PATH [VAR]: where the profile lives.
resolve_site_file() {
  local name=$1
  if [[ "$name" == */* || "$name" == *.conf ]]; then
    emit "${2:-}" "$name"
  elif [[ -f "${HPC_SITES_DIR:-$HOME/.config/hpc_files/sites}/$name.conf" ]]; then
    emit "${2:-}" "${HPC_SITES_DIR:-$HOME/.config/hpc_files/sites}/$name.conf"
  else
    emit "${2:-}" "$HPC_FILES_DIR/sites/$name.conf"
  fi
}

# load_site: read the profile named by --site, HPC_SITE or the default, and
# fill site_* variables; a site value becomes the default of its option.
load_site() {
  local line key value number=0
  site_name=${opt_site:-${HPC_SITE:-$DEFAULT_SITE}}
  [[ -n "$site_name" ]] || usage_error "--site expects a name or a file, got ''"
  resolve_site_file "$site_name" site_file
  [[ -f "$site_file" ]] ||
    usage_error "site profile '$site_name' not found (looked for $site_file; shipped: $(list_shipped_sites))"
  [[ -r "$site_file" ]] || usage_error "site profile $site_file is not readable"
  while IFS= read -r line || [[ -n "$line" ]]; do
    number=$((number + 1))
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line%"${line##*[![:space:]]}"}"
    [[ -z "$line" || "$line" == \#* ]] && continue
    [[ "$line" == *=* ]] || usage_error "$site_file:$number: expected 'key = value', got '$line'"
    key="${line%%=*}"
    key="${key%"${key##*[![:space:]]}"}"
    value="${line#*=}"
    value="${value#"${value%%[![:space:]]*}"}"
    case "${SITE_KEYS[$key]:-}" in
      scalar) printf -v "site_${key}" '%s' "$value" ;;
      list) eval "site_${key}+=(\"\$value\")" ;;
      *) usage_error "$site_file:$number: unknown key '$key' (known: $(printf '%s\n' "${!SITE_KEYS[@]}" | sort | tr '\n' ' '))" ;;
    esac
  done <"$site_file"
  apply_site_defaults
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

apply_site_defaults() {
  [[ -n "${OPT_GIVEN[account]:-}" ]] || opt_account=${site_account:-}
  [[ -n "${OPT_GIVEN[partition]:-}" ]] || opt_partition=${site_partition:-}
  [[ -n "${OPT_GIVEN[modules]:-}" ]] || opt_modules=${site_modules:-}
  [[ -n "${OPT_GIVEN[array_throttle]:-}" ]] || opt_array_throttle=${site_array_throttle:-}
  : "${site_provides_tmpdir:=auto}"
  : "${site_tmpdir_base:=/tmp}"
  : "${site_container_runtime:=}"
}
