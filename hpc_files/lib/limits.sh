# shellcheck shell=bash
# What the cluster would refuse, said at submission with its numbers: a wall
# time over the partition's MaxTime, memory over what its nodes have, an
# account that is not the user's. Each check asks the cluster (scontrol,
# sinfo) and is skipped when it cannot say: SLURM then decides. Every
# question goes to slurmctld, never to slurmdbd: sacctmgr's answer takes
# about 200 ms, more than the rest of a submission (bench/submit_latency.sh).
# Sourced; functions only.

# ask_slurm: the questions the submission's checks put to SLURM, sent at
# once and in the background (start_background) as soon as the site profile
# has named the cluster (its slurm_conf): no question depends on the plan
# (they ask for every partition and all of the user's jobs), each SLURM
# command costs about 12 ms, most of it its own start, and the validation
# and planning run meanwhile. squeue lists the user's jobs
# (queue_after_running); unless --dry-run, one scontrol answers the
# partitions and the user's accounts, and sinfo the nodes' memory
# (validate_allocation). The answers wait in work_dir, each in answer.NAME
# (await_answer). --list-trials asks nothing.
ask_slurm() {
  [[ -z "${opt_list_trials:-}" ]] || return 0
  ask_queue
  [[ -z "${opt_dry_run:-}" ]] || return 0
  start_background controller ask_controller "$slurm_user" >"$work_dir/answer.controller"
  start_background nodes timeout 10 sinfo -h -o '%R %m' >"$work_dir/answer.nodes" 2>/dev/null
}

# ask_controller USER: one scontrol, which reads its commands from stdin,
# for the partitions (one a line) and USER's associations. Its status is
# that of the last command that failed (a cluster without accounting may
# fail the second): what it printed is the answer, each check finding its
# own records in it.
ask_controller() {
  timeout 10 scontrol -o 2>/dev/null <<<"show partition
show assoc_mgr users=$1 flags=users,assoc" || :
}

# validate_allocation: the checks, for the partition the job goes to (the
# plan's first, else the cluster's default). --dry-run asks nothing. A
# question SLURM did not answer leaves its check nothing to say.
validate_allocation() {
  local controller nodes record partition
  [[ -z "${opt_dry_run:-}" ]] || return 0
  await_answer controller || :
  await_answer nodes || :
  controller=$(<"$work_dir/answer.controller")
  nodes=$(<"$work_dir/answer.nodes")
  record=$(partition_record "$controller" "${plan_partition%%,*}")
  if [[ -n "$record" ]]; then
    partition=$(record_field "$record" PartitionName)
    check_partition_time "$partition" "$record"
    check_partition_memory "$partition" "$record" "$nodes"
  fi
  check_account "$slurm_user" "$controller"
}

# partition_record RECORDS NAME: the line of 'scontrol show partition -o'
# RECORDS for partition NAME, or for the Default=YES one when NAME is '';
# nothing when none matches.
partition_record() {
  local line
  while IFS= read -r line; do
    if [[ -n "$2" && "$line" == "PartitionName=$2 "* ]] ||
      [[ -z "$2" && " $line " == *" Default=YES "* ]]; then
      printf '%s\n' "$line"
      return 0
    fi
  done <<<"$1"
}

# check_partition_time PARTITION RECORD: --time within its MaxTime.
check_partition_time() {
  local max max_seconds
  max=$(record_field "$2" MaxTime) || return 0
  max_seconds=$(parse_slurm_time "$max")
  [[ -n "$max_seconds" ]] || return 0
  ((plan_time_seconds <= max_seconds)) ||
    usage_error "--time $plan_time ($plan_time_seconds s) is over the MaxTime of partition '$1', $max ($max_seconds s); lower -t or pick another partition with -p"
}

# check_partition_memory PARTITION RECORD NODES: the job's memory per node
# (--mem) within the partition's MaxMemPerNode and its largest node's
# RealMemory (NODES: sinfo's 'PARTITION MEMORY' lines).
check_partition_memory() {
  local need=$plan_mem_mb limit="" largest=0 name mb
  [[ -n "$need" ]] && ((need > 0)) || return 0
  limit=$(record_field "$2" MaxMemPerNode) || true
  if [[ "$limit" =~ ^[0-9]+$ ]] && ((need > limit)); then
    usage_error "this job asks for $need MiB per node (--mem $plan_mem: -m/--mem-per-gpu x GPUs or processes) but partition '$1' allows $limit MiB (MaxMemPerNode); lower -m"
  fi
  while read -r name mb; do
    [[ "$name" == "$1" && "$mb" =~ ^[0-9]+$ ]] && ((mb > largest)) && largest=$mb
  done <<<"$3"
  ((largest == 0 || need <= largest)) ||
    usage_error "this job asks for $need MiB per node (--mem $plan_mem: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition '$1' has $largest MiB; lower -m"
}

# check_account USER STATE: where SLURM keeps accounts, the job's account is
# one of USER's, or USER has a default one; refused naming them. STATE is the
# controller's copy of the associations ('scontrol show assoc_mgr'), as
# sacctmgr's in a tenth of its time (sacctmgr asks slurmdbd); with no
# association at all, the cluster keeps no accounting.
check_account() {
  local user=$1 state=$2 both default accounts
  [[ "$state" == *$'\n'ClusterName=* ]] || return 0
  both=$(user_accounts "$state" "$user")
  default=${both%%$'\n'*}
  accounts=${both#*$'\n'}
  [[ -n "$accounts" ]] || usage_error "user $user has no SLURM account on this cluster (sacctmgr show assoc); ask the admins for one"
  if [[ -n "$plan_account" ]]; then
    [[ " $accounts " == *" $plan_account "* ]] ||
      usage_error "--account '$plan_account' is not one of user $user's accounts: ${accounts// /, }"
    return 0
  fi
  [[ -n "$default" ]] ||
    usage_error "user $user has no default SLURM account; give one with -a/--account: ${accounts// /, }"
}

# user_accounts STATE USER: from 'scontrol show assoc_mgr' STATE, two lines:
# USER's default account (its UserName=USER(uid) record's DefAccount), then
# the accounts of USER's associations (ClusterName= records), sorted, once
# each, space-separated. Empty values are left out.
user_accounts() {
  awk -v user="$2" '
    function field(name,   i) {
      for (i = 1; i <= NF; i++) if (index($i, name "=") == 1) return substr($i, length(name) + 2)
      return ""
    }
    function owner(   name) { name = field("UserName"); sub(/\(.*/, "", name); return name }
    index($1, "UserName=") == 1 && owner() == user && field("DefAccount") != "" { def_account = field("DefAccount") }
    index($1, "ClusterName=") == 1 && owner() == user && field("Account") != "" { seen[field("Account")] = 1 }
    END {
      n = 0
      for (account in seen) {
        # Insertion sort: a user has a handful of accounts.
        for (i = n++; i > 0 && list[i - 1] > account; i--) list[i] = list[i - 1]
        list[i] = account
      }
      joined = ""
      for (i = 0; i < n; i++) joined = joined (i ? " " : "") list[i]
      print def_account
      print joined
    }' <<<"$1"
}
