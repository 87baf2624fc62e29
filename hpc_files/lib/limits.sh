# shellcheck shell=bash
# What the cluster would refuse, said at submission with its numbers: a wall
# time over the partition's MaxTime, memory over what its nodes have, an
# account that is not the user's. Each check asks the cluster (scontrol,
# sinfo, sacctmgr) and is skipped when it cannot say: SLURM then decides.
# Sourced; functions only.

# validate_allocation: the checks, for the partition the job goes to (the
# plan's first, else the cluster's default). --dry-run asks nothing.
validate_allocation() {
  local partition record
  [[ -z "${opt_dry_run:-}" ]] || return 0
  partition=${plan_partition%%,*}
  [[ -n "$partition" ]] || partition=$(default_partition)
  if [[ -n "$partition" ]] && record=$(timeout 10 scontrol show partition "$partition" -o 2>/dev/null); then
    check_partition_time "$partition" "$record"
    check_partition_memory "$partition" "$record"
  fi
  check_account
}

# default_partition: the partition marked Default=YES; '' when none answers.
default_partition() {
  local line
  while IFS= read -r line; do
    [[ " $line " != *" Default=YES "* ]] || {
      record_field "$line" PartitionName || true
      return 0
    }
  done < <(timeout 10 scontrol show partition -o 2>/dev/null)
}

# check_partition_time PARTITION RECORD: --time within its MaxTime.
check_partition_time() {
  local max max_seconds seconds
  max=$(record_field "$2" MaxTime) || return 0
  max_seconds=$(parse_slurm_time "$max")
  [[ -n "$max_seconds" ]] || return 0
  seconds=$(parse_slurm_time "$plan_time")
  ((seconds <= max_seconds)) ||
    usage_error "--time $plan_time ($seconds s) is over the MaxTime of partition '$1', $max ($max_seconds s); lower -t or pick another partition with -p"
}

# check_partition_memory PARTITION RECORD: the job's memory per node (--mem)
# within the partition's MaxMemPerNode and its largest node's RealMemory.
check_partition_memory() {
  local need limit="" largest=0 mb
  need=$(parse_memory_mb "$plan_mem")
  [[ -n "$need" ]] && ((need > 0)) || return 0
  limit=$(record_field "$2" MaxMemPerNode) || true
  if [[ "$limit" =~ ^[0-9]+$ ]] && ((need > limit)); then
    usage_error "this job asks for $need MiB per node (--mem $plan_mem: -m/--mem-per-gpu x GPUs or processes) but partition '$1' allows $limit MiB (MaxMemPerNode); lower -m"
  fi
  while read -r mb; do
    [[ "$mb" =~ ^[0-9]+$ ]] && ((mb > largest)) && largest=$mb
  done < <(timeout 10 sinfo -h -p "$1" -o '%m' 2>/dev/null)
  ((largest == 0 || need <= largest)) ||
    usage_error "this job asks for $need MiB per node (--mem $plan_mem: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition '$1' has $largest MiB; lower -m"
}

# check_account: where SLURM keeps accounts (slurmdbd), the job's account is
# one of the user's, or the user has a default one; refused naming them.
check_account() {
  local config user accounts default
  config=$(timeout 10 scontrol show config 2>/dev/null) || return 0
  [[ "$config" =~ AccountingStorageType[[:space:]]*=[[:space:]]*accounting_storage/slurmdbd ]] || return 0
  user=${USER:-$(id -un)}
  accounts=$(timeout 10 sacctmgr -nP show assoc where user="$user" format=account 2>/dev/null | sort -u | tr '\n' ' ') || return 0
  accounts=${accounts% }
  [[ -n "$accounts" ]] || usage_error "user $user has no SLURM account on this cluster (sacctmgr show assoc); ask the admins for one"
  if [[ -n "$plan_account" ]]; then
    [[ " $accounts " == *" $plan_account "* ]] ||
      usage_error "--account '$plan_account' is not one of user $user's accounts: ${accounts// /, }"
    return 0
  fi
  default=$(timeout 10 sacctmgr -nP show user "$user" format=defaultaccount 2>/dev/null) || return 0
  [[ -n "$default" ]] ||
    usage_error "user $user has no default SLURM account; give one with -a/--account: ${accounts// /, }"
}
