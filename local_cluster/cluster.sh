#!/usr/bin/env bash
# A real multi-node SLURM cluster on this one machine, for the demo and the
# integration tests: one munged, one slurmctld and several `slurmd -N nodeK`,
# each node claiming fake GPUs (GRES on /dev/tty*) and more CPUs than exist.
#
# Shaped like production (Compute Canada) by default, so the suites meet what
# users meet: slurmdbd on the cluster's own MariaDB (accounts def-lab and
# rrg-lab, the user in both, def-lab the default; AccountingStorageEnforce=
# associations,limits,qos; sacct), memory a consumable resource
# (CR_Core_Memory, DefMemPerCPU, MaxMemPerNode), partition MaxTime and
# DefaultTime enforced at submission, and cgroups (proctrack/cgroup,
# task/affinity,task/cgroup constraining cores, memory and the fake GPU
# devices) where 'up' finds cgroup v1 controllers it may write; where not, it
# says so in one line and tracks processes by parent pid.
# HPC_CLUSTER_SHAPE=friendly: none of that (no accounting, nothing enforced),
# for debugging; 'down' first to switch a running cluster.
#
# Usage: local_cluster/cluster.sh up|down|status|env|ports
#
#   up      write the configuration, start the daemons, wait until every node is
#           idle. Idempotent: a running cluster is left as it is.
#   down    cancel this cluster's jobs and stop the daemons this script started
#           (found through their pid files; nothing else is ever signalled).
#   status  daemons, nodes and partitions.
#   env     print the `export SLURM_CONF=...` line clients need (and the
#           PATH line under SLURM_PREFIX).
#   ports   the ports this cluster listens on (or would, at 'up').
#
# Everything lives under HPC_CLUSTER_DIR (default: <repo>/.cluster), on
# non-default ports, with its own munge socket and database (db/: datadir,
# socket, port), so a real SLURM, munge or MariaDB on the machine is never
# touched. Partitions (all over the same nodes):
#   tmpdir    default; a TaskProlog exports a per-node, per-job SLURM_TMPDIR
#             (as Compute Canada sites do); an Epilog removes it.
#   notmpdir  no SLURM_TMPDIR (as the PLAI cluster): the toolkit must mimic it.
#   urgent    higher PriorityTier; preempts the others (PreemptMode=REQUEUE).
# Node names resolve through /etc/hosts lines this script adds (127.0.0.1N
# nodeN, marked with a comment) because torchrun and Lightning need
# MASTER_ADDR, the first node's name, to resolve.
#
# Knobs: HPC_CLUSTER_DIR, HPC_CLUSTER_NODES (default 2), HPC_CLUSTER_CPUS
# (per node, default 8), HPC_CLUSTER_GPUS (per node, default 4),
# HPC_CLUSTER_CTLD_PORT, HPC_CLUSTER_NODE_PORT (first slurmd port),
# HPC_CLUSTER_GRACE (preemption grace seconds, 30), HPC_CLUSTER_MAX_ARRAY_SIZE
# (MaxArraySize, default 1001 as SLURM's; small, it tests sweeps split into
# several arrays), HPC_CLUSTER_SHAPE (production or friendly),
# HPC_CLUSTER_CGROUPS (auto, or no: never use them).
#
# Two clusters on one machine (two clones, or a clone beside a working tree)
# share nothing: each has its own folder, munge socket, node-local folders
# (the 'local' site profile's mimic SLURM_TMPDIR base is <folder>/local-ssd)
# and cgroups (CgroupMountpoint=<folder>/cgroup, see CGROUP_ROOT),
# and its own ports: without the port knobs, 'up' takes a block of 128 ports
# in 30000-32767 (above jobs' MASTER_PORT range, below Linux's ephemeral one)
# chosen from a hash of the folder's path, the next free block when another
# program holds a port of it; slurm.conf records them, and a later 'up' keeps
# them while any of the cluster's daemons runs. 'ports' prints them. The
# first job id comes from the same hash, so the two clusters' jobs (and the
# MASTER_PORT each derives from its id) do not pair up.
#
# Another SLURM: SLURM_PREFIX=/opt/slurm-24.11 (a folder with bin/ and sbin/)
# runs that build's daemons and clients instead of the ones on PATH, under
# <repo>/.cluster-24.11 (the prefix's name without 'slurm-'), so it runs
# beside the default cluster without touching it.
# Jobs inherit the submitting PATH, and a 22.05 srun first on PATH fails in a
# 24.11 job ("Invalid Protocol Version"): `env` prints the PATH line too, and
# the TaskProlog puts the prefix's bin/ first for jobs that inherit nothing
# (--export=NONE).
set -euo pipefail

readonly PROG="cluster.sh"
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
readonly REPO_ROOT

readonly SLURM_PREFIX="${SLURM_PREFIX:-}"
if [[ -n "$SLURM_PREFIX" ]]; then
  [[ -x "$SLURM_PREFIX/sbin/slurmctld" && -x "$SLURM_PREFIX/bin/sinfo" ]] ||
    { echo "$PROG: error: SLURM_PREFIX '$SLURM_PREFIX' has no sbin/slurmctld and bin/sinfo" >&2; exit 1; }
  PATH="$SLURM_PREFIX/bin:$SLURM_PREFIX/sbin:$PATH"
  prefix_name=${SLURM_PREFIX%/}
  prefix_name=${prefix_name##*/}
  readonly DEFAULT_DIR="$REPO_ROOT/.cluster-${prefix_name#slurm-}"
else
  readonly DEFAULT_DIR="$REPO_ROOT/.cluster"
fi
readonly CLUSTER_DIR="${HPC_CLUSTER_DIR:-$DEFAULT_DIR}"
readonly NODE_COUNT="${HPC_CLUSTER_NODES:-2}"
readonly NODE_CPUS="${HPC_CLUSTER_CPUS:-8}"
readonly NODE_GPUS="${HPC_CLUSTER_GPUS:-4}"
# Set by choose_ports (the knobs, else slurm.conf's record, else a free block).
CTLD_PORT="" NODE_PORT=""
readonly PORT_FIRST=30000 PORT_BLOCK=128 PORT_BLOCKS=21
# The block's slot (and the first job id) from the folder's path.
FOLDER_HASH=$(printf '%s' "$CLUSTER_DIR" | cksum | cut -d' ' -f1)
readonly FOLDER_HASH
readonly GRACE_SECONDS="${HPC_CLUSTER_GRACE:-30}"
readonly SHAPE="${HPC_CLUSTER_SHAPE:-production}"
readonly CGROUPS="${HPC_CLUSTER_CGROUPS:-auto}"
# The accounts every production-shaped cluster has; the first is the user's
# default (and the 'local' site profile's account).
readonly ACCOUNTS=(def-lab rrg-lab)
# Memory: what a node declares, the most one job may have on it, and what a
# job that asks for none gets per CPU (Compute Canada's is 256M; the
# toolkit asks for its memory itself).
readonly NODE_MEMORY_MB=65536 MAX_MEM_PER_NODE_MB=61440 DEF_MEM_PER_CPU_MB=1024
readonly MAX_TIME=1-00:00:00 DEFAULT_TIME=01:00:00
readonly MAX_ARRAY_SIZE="${HPC_CLUSTER_MAX_ARRAY_SIZE:-1001}"
readonly HOSTS_MARK="# hpc-local-cluster"
readonly WAIT_SECONDS=60

readonly CONF="$CLUSTER_DIR/etc/slurm.conf"
readonly MUNGE_DIR="$CLUSTER_DIR/munge"
readonly MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
readonly DB_DIR="$CLUSTER_DIR/db"
readonly DB_SOCKET="$DB_DIR/mariadbd.sock"
# The cgroup v1 controllers slurmd's plugins use (task/cgroup,
# proctrack/cgroup, jobacct_gather/cgroup).
readonly CGROUP_CONTROLLERS=(cpuset memory devices freezer cpuacct)
# Each cluster's own cgroup root: slurmd puts its cgroups under
# <CgroupMountpoint>/<controller>/slurm_<node name>, and two clusters both
# have a node1 (slurm 22.05 has no knob for that 'slurm_%n'). So 'up' makes
# a folder per cluster in each controller's hierarchy
# (/sys/fs/cgroup/<controller>/hpc-cluster-<hash>) and bind-mounts it at
# <folder>/cgroup/<controller>, which cgroup.conf's CgroupMountpoint names:
# one cluster's job steps never touch the other's node cgroups (where two
# clusters share slurm_node1/uid_0, running jobs of both fail to launch
# their steps: "job allocated no CPUs").
readonly CGROUP_ROOT="$CLUSTER_DIR/cgroup"
readonly CGROUP_NAME="hpc-cluster-$FOLDER_HASH"

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

info() {
  echo "$PROG: $*"
}

node_names() {
  local i
  for ((i = 1; i <= NODE_COUNT; i++)); do
    echo "node$i"
  done
}

node_port() {
  local index=$1
  echo $((NODE_PORT + index - 1))
}

# recorded_ports: 'CTLD NODE' from an existing slurm.conf, or nothing.
recorded_ports() {
  local ctld node
  [[ -f "$CONF" ]] || return 0
  ctld=$(sed -n 's/^SlurmctldPort=\([0-9]*\)$/\1/p' "$CONF")
  node=$(sed -n 's/^NodeName=.* Port=\([0-9]*\).*/\1/p' "$CONF" | head -n 1)
  [[ -z "$ctld" || -z "$node" ]] || echo "$ctld $node"
}

# any_daemon_alive: is a daemon of this cluster that holds a port running?
any_daemon_alive() {
  local name
  pidfile_alive "$CLUSTER_DIR/run/slurmctld.pid" && return 0
  pidfile_alive "$CLUSTER_DIR/run/slurmdbd.pid" && return 0
  pidfile_alive "$DB_DIR/mariadbd.pid" && return 0
  for name in $(node_names); do
    pidfile_alive "$CLUSTER_DIR/run/slurmd-$name.pid" && return 0
  done
  return 1
}

# Is the process in pid file $1 alive and one of ours (its command line names
# our configuration folder, or its environment our slurm.conf)? Guards
# against a recycled pid.
pidfile_alive() {
  local pidfile=$1 pid cmdline
  [[ -s "$pidfile" ]] || return 1
  pid=$(<"$pidfile")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline")
  [[ "$cmdline" == *"$CLUSTER_DIR"* ]] && return 0
  # slurmdbd takes no configuration argument: it has SLURM_CONF in its environment.
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"
}

port_in_use() {
  local port=$1
  ss -Hltn "sport = :$port" 2>/dev/null | grep -q .
}

# ports_free CTLD NODE: are CTLD (and slurmdbd's and MariaDB's after it) and
# the NODE_COUNT ports from NODE unused?
ports_free() {
  local i
  for ((i = 0; i < 3; i++)); do
    port_in_use "$(($1 + i))" && return 1
  done
  for ((i = 0; i < NODE_COUNT; i++)); do
    port_in_use "$(($2 + i))" && return 1
  done
  return 0
}

# choose_ports [probe]: CTLD_PORT and NODE_PORT. The ports slurm.conf records,
# kept while a daemon of ours runs; else, or when another program now holds
# one of them (probe), the first free block from the folder's slot on. Each
# knob wins over what was chosen (check_ports refuses it when it is taken).
choose_ports() {
  local probe=${1:-} recorded slot tries
  recorded=$(recorded_ports)
  if [[ -n "$recorded" ]] && { [[ "$probe" != probe ]] || any_daemon_alive || ports_free "${recorded% *}" "${recorded#* }"; }; then
    CTLD_PORT=${recorded% *}
    NODE_PORT=${recorded#* }
  else
    slot=$((FOLDER_HASH % PORT_BLOCKS))
    for ((tries = 0; tries < PORT_BLOCKS; tries++)); do
      CTLD_PORT=$((PORT_FIRST + slot * PORT_BLOCK))
      NODE_PORT=$((CTLD_PORT + 8))
      if [[ "$probe" != probe ]] || ports_free "$CTLD_PORT" "$NODE_PORT"; then
        break
      fi
      slot=$(((slot + 1) % PORT_BLOCKS))
    done
    ((tries < PORT_BLOCKS)) ||
      die "no block of $PORT_BLOCK free ports in $PORT_FIRST-$((PORT_FIRST + PORT_BLOCKS * PORT_BLOCK - 1)); set HPC_CLUSTER_CTLD_PORT and HPC_CLUSTER_NODE_PORT"
  fi
  CTLD_PORT=${HPC_CLUSTER_CTLD_PORT:-$CTLD_PORT}
  NODE_PORT=${HPC_CLUSTER_NODE_PORT:-$NODE_PORT}
}

# first_job_id: the cluster's first job id, from its block of ports, which no
# other cluster up on this machine holds (two folders' hashes may name the
# same block; the second 'up' takes the next): two clusters' job ids, and
# the MASTER_PORT each job derives from its id, then do not pair up.
first_job_id() {
  local slot=$(((CTLD_PORT - PORT_FIRST) / PORT_BLOCK))
  ((slot >= 0)) || slot=$((-slot))
  printf '%s' $((1 + slot % PORT_BLOCKS * 600))
}

check_prerequisites() {
  local cmd
  [[ "$(id -u)" == 0 ]] || die "the local cluster runs its daemons as root (SlurmUser=root); run as root or with sudo"
  [[ "$SHAPE" =~ ^(production|friendly)$ ]] || die "HPC_CLUSTER_SHAPE must be production or friendly, got '$SHAPE'"
  [[ "$CGROUPS" =~ ^(auto|no)$ ]] || die "HPC_CLUSTER_CGROUPS must be auto or no, got '$CGROUPS'"
  for cmd in munged mungekey slurmctld slurmd sinfo scontrol ss; do
    command -v "$cmd" >/dev/null || die "'$cmd' not found; run 'make deps' (apt-get install slurm-wlm munge iproute2)"
  done
  if [[ "$SHAPE" == production ]]; then
    for cmd in slurmdbd sacctmgr mariadbd mariadb-install-db mariadb; do
      command -v "$cmd" >/dev/null ||
        die "'$cmd' not found; run 'make deps' (apt-get install slurmdbd mariadb-server), or HPC_CLUSTER_SHAPE=friendly"
    done
    # A build of its own needs its own slurmdbd, built with MySQL support.
    [[ -z "$SLURM_PREFIX" || -e "$SLURM_PREFIX/lib/slurm/accounting_storage_mysql.so" ]] ||
      die "SLURM_PREFIX '$SLURM_PREFIX' has no lib/slurm/accounting_storage_mysql.so (slurmdbd built without MySQL); use HPC_CLUSTER_SHAPE=friendly"
  fi
  [[ "$NODE_COUNT" =~ ^[1-9][0-9]?$ ]] || die "HPC_CLUSTER_NODES must be 1-99, got '$NODE_COUNT'"
  [[ "$NODE_GPUS" =~ ^[0-4]$ ]] || die "HPC_CLUSTER_GPUS must be 0-4 (fake GPUs are /dev/tty0-3), got '$NODE_GPUS'"
  [[ "$MAX_ARRAY_SIZE" =~ ^[1-9][0-9]{0,6}$ ]] || die "HPC_CLUSTER_MAX_ARRAY_SIZE must be 1-9999999, got '$MAX_ARRAY_SIZE'"
  [[ "${HPC_CLUSTER_CTLD_PORT:-1}${HPC_CLUSTER_NODE_PORT:-1}" =~ ^[0-9]+$ ]] ||
    die "HPC_CLUSTER_CTLD_PORT and HPC_CLUSTER_NODE_PORT must be port numbers, got '${HPC_CLUSTER_CTLD_PORT:-}' and '${HPC_CLUSTER_NODE_PORT:-}'"
  # slurm.conf has no quoting: a path with spaces or odd characters would be split.
  [[ "$CLUSTER_DIR" =~ ^/[A-Za-z0-9._/-]+$ ]] ||
    die "HPC_CLUSTER_DIR must be an absolute path of letters, digits, '.', '_', '-' and '/' (slurm.conf cannot quote), got '$CLUSTER_DIR'"
}

write_file() {
  local path=$1 mode=$2
  cat >"$path.tmp"
  chmod "$mode" "$path.tmp"
  mv -f "$path.tmp" "$path"
}

# shape_lines MODE: the slurm.conf lines that differ between the shapes
# (MODE: cgroup or none, from cgroup_mode).
shape_lines() {
  local mode=$1
  if [[ "$SHAPE" == friendly ]]; then
    cat <<EOF
# Friendly shape (HPC_CLUSTER_SHAPE=friendly): nothing enforced, no accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectTypeParameters=CR_Core
# Finished jobs stay visible to 'scontrol show job' (no accounting database).
MinJobAge=900
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
EOF
    return 0
  fi
  cat <<EOF
# Production shape, as Compute Canada's clusters: accounts and limits
# enforced by slurmdbd (its own MariaDB), memory a consumable resource.
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$DEF_MEM_PER_CPU_MB
# A request over a partition's limits is refused at submission, not left pending.
EnforcePartLimits=ALL
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$(dbd_port)
# For slurmdbd connections, clients take the munge socket from here, not AuthInfo.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu
JobAcctGatherFrequency=10
EOF
  if [[ "$mode" == cgroup ]]; then
    cat <<EOF
ProctrackType=proctrack/cgroup
TaskPlugin=task/affinity,task/cgroup
# No binding by default: the nodes claim more CPUs than the machine has, and
# binding each task to cores of its own fails ("Unable to layout tasks on
# given cpus") where a step has more tasks than real cores.
TaskPluginParam=None
JobAcctGatherType=jobacct_gather/cgroup
EOF
  else
    cat <<EOF
# No cgroups here ($cgroup_reason): processes tracked by parent pid.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
EOF
  fi
}

# partition_limits: MaxTime, DefaultTime and MaxMemPerNode of every partition.
partition_limits() {
  if [[ "$SHAPE" == friendly ]]; then
    echo "MaxTime=INFINITE"
  else
    echo "MaxTime=$MAX_TIME DefaultTime=$DEFAULT_TIME MaxMemPerNode=$MAX_MEM_PER_NODE_MB"
  fi
}

dbd_port() {
  echo $((CTLD_PORT + 1))
}

db_port() {
  echo $((CTLD_PORT + 2))
}

# write_slurm_conf MODE: slurm.conf, cgroup.conf, gres.conf and the site's
# prolog and epilog (MODE: cgroup or none, from cgroup_mode).
write_slurm_conf() {
  local mode=$1 last_port gres_line="" limits
  last_port=$(node_port "$NODE_COUNT")
  limits=$(partition_limits)
  ((NODE_GPUS > 0)) && gres_line="Gres=gpu:$NODE_GPUS"
  write_file "$CONF" 0644 <<EOF
# Written by local_cluster/cluster.sh; edits are overwritten by the next 'up'.
# Shape: $SHAPE
ClusterName=hpclocal
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
FirstJobId=$(first_job_id)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$CLUSTER_DIR/state
SlurmdSpoolDir=$CLUSTER_DIR/spool/%n
SlurmctldPidFile=$CLUSTER_DIR/run/slurmctld.pid
SlurmdPidFile=$CLUSTER_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$CLUSTER_DIR/log/slurmctld.log
SlurmdLogFile=$CLUSTER_DIR/log/slurmd-%n.log
$(shape_lines "$mode")
SelectType=select/cons_tres
SchedulerType=sched/backfill
# A job whose dependency is met (a bayes controller after its round) starts at
# the next backfill pass: every 2 s here, not SLURM's 30, so a test does not
# wait half a minute per dependency; a pass over a few jobs costs nothing.
SchedulerParameters=bf_interval=2
MpiDefault=none
JobRequeue=1
MaxArraySize=$MAX_ARRAY_SIZE
# No mail on this machine (24.11 logs an error for a missing /bin/mail).
MailProg=/bin/true
JobCompType=jobcomp/none
# A killed slurmd marks its node DOWN within seconds; a restarted one rejoins.
SlurmdTimeout=10
ReturnToService=2
MessageTimeout=10
# A batch step slow to start on a loaded 2-core machine (the suites side by
# side) is not taken for a lost node and requeued, as it is after 10 s.
BatchStartTimeout=60
KillWait=10
InactiveLimit=0
GresTypes=gpu
SlurmdParameters=config_overrides
TaskProlog=$CLUSTER_DIR/etc/task_prolog.sh
Epilog=$CLUSTER_DIR/etc/epilog.sh
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=node[1-$NODE_COUNT] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_PORT-$last_port CPUs=$NODE_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=$NODE_MEMORY_MB $gres_line State=UNKNOWN
PartitionName=tmpdir Nodes=ALL Default=YES $limits State=UP PriorityTier=1 GraceTime=$GRACE_SECONDS
PartitionName=notmpdir Nodes=ALL $limits State=UP PriorityTier=1 GraceTime=$GRACE_SECONDS
PartitionName=urgent Nodes=ALL $limits State=UP PriorityTier=10 PreemptMode=OFF
EOF
  write_file "$CLUSTER_DIR/etc/cgroup.conf" 0644 <<EOF
# Read by slurmd's cgroup plugins (production shape, where the kernel allows).
# ConstrainDevices fences off the fake GPUs (/dev/tty*) a job was not given.
CgroupPlugin=cgroup/v1
# This cluster's own folder in each hierarchy (mount_cgroups), not /sys/fs/cgroup.
CgroupMountpoint=$CGROUP_ROOT
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
EOF
  write_file "$CLUSTER_DIR/etc/gres.conf" 0644 <<EOF
AutoDetect=off
NodeName=node[1-$NODE_COUNT] Name=gpu File=/dev/tty[0-$((NODE_GPUS > 0 ? NODE_GPUS - 1 : 0))]
EOF
  # Emulates a site that provides SLURM_TMPDIR: one folder per node per job.
  # A job submitted with --export=NONE gets a login PATH, where this
  # SLURM_PREFIX's srun is not (a real cluster's is): its tasks get it here.
  local path_line=""
  [[ -z "$SLURM_PREFIX" ]] || path_line="echo \"export PATH=$SLURM_PREFIX/bin:\$PATH\""
  write_file "$CLUSTER_DIR/etc/task_prolog.sh" 0755 <<EOF
#!/bin/sh
# TaskProlog: lines printed as 'export NAME=value' reach every task.
$path_line
case "\$SLURM_JOB_PARTITION" in
  tmpdir|urgent) ;;
  *) exit 0 ;;
esac
dir="$CLUSTER_DIR/local/\$SLURMD_NODENAME/job\$SLURM_JOB_ID"
mkdir -p "\$dir"
echo "export SLURM_TMPDIR=\$dir"
EOF
  write_file "$CLUSTER_DIR/etc/epilog.sh" 0755 <<EOF
#!/bin/sh
# Epilog (root, once per node at job end): the site removes its SLURM_TMPDIR.
case "\$SLURM_JOB_ID" in
  ''|*[!0-9]*) exit 0 ;;
esac
case "\$SLURMD_NODENAME" in
  ''|*/*|.|..) exit 0 ;;
esac
rm -rf -- "$CLUSTER_DIR/local/\$SLURMD_NODENAME/job\$SLURM_JOB_ID"
exit 0
EOF
}

ensure_hosts_entries() {
  local i name line
  for ((i = 1; i <= NODE_COUNT; i++)); do
    name="node$i"
    line="127.0.0.$((10 + i)) $name $HOSTS_MARK"
    if getent hosts "$name" >/dev/null; then
      continue
    fi
    { echo "$line" >>/etc/hosts; } 2>/dev/null ||
      die "cannot add '$name' to /etc/hosts (read-only?); node names must resolve for MASTER_ADDR"
  done
}

# detached CMD...: start a daemon without handing it this shell's open file
# descriptors beyond stderr: a daemon that keeps a caller's pipe open (a test
# runner's output, a $(...) capture) makes that caller wait for it forever.
detached() {
  (
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then
        eval "exec $fd>&-"
      fi
    done
    exec "$@" </dev/null >/dev/null
  )
}

start_munge() {
  if pidfile_alive "$MUNGE_DIR/munged.pid"; then
    return 0
  fi
  if [[ ! -s "$MUNGE_DIR/munge.key" ]]; then
    mungekey --create --keyfile="$MUNGE_DIR/munge.key" >/dev/null 2>&1 ||
      die "mungekey could not create $MUNGE_DIR/munge.key"
  fi
  chmod 0400 "$MUNGE_DIR/munge.key"
  # --force: munged refuses to run as root with a root-owned log folder otherwise.
  detached munged --force --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$CLUSTER_DIR/log/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" ||
    die "munged did not start; see $CLUSTER_DIR/log/munged.log"
  wait_for "munged socket" 10 test -S "$MUNGE_SOCKET"
}

# wait_for WHAT SECONDS CMD...: poll CMD every 0.2 s until it succeeds.
wait_for() {
  local what=$1 seconds=$2 deadline
  shift 2
  deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# Before anything starts: every port a daemon still has to take must be free.
check_ports() {
  local i
  if ! pidfile_alive "$CLUSTER_DIR/run/slurmctld.pid" && port_in_use "$CTLD_PORT"; then
    die "port $CTLD_PORT (slurmctld) is in use by another program; set HPC_CLUSTER_CTLD_PORT"
  fi
  if [[ "$SHAPE" == production ]]; then
    if ! pidfile_alive "$CLUSTER_DIR/run/slurmdbd.pid" && port_in_use "$(dbd_port)"; then
      die "port $(dbd_port) (slurmdbd, slurmctld's + 1) is in use by another program; set HPC_CLUSTER_CTLD_PORT"
    fi
    if ! pidfile_alive "$DB_DIR/mariadbd.pid" && port_in_use "$(db_port)"; then
      die "port $(db_port) (MariaDB, slurmctld's + 2) is in use by another program; set HPC_CLUSTER_CTLD_PORT"
    fi
  fi
  for ((i = 1; i <= NODE_COUNT; i++)); do
    if ! pidfile_alive "$CLUSTER_DIR/run/slurmd-node$i.pid" && port_in_use "$(node_port "$i")"; then
      die "port $(node_port "$i") (slurmd node$i) is in use by another program; set HPC_CLUSTER_NODE_PORT"
    fi
  done
}

# recorded_shape: the shape slurm.conf was written for, or nothing.
recorded_shape() {
  [[ ! -f "$CONF" ]] || sed -n 's/^# Shape: \([a-z]*\)$/\1/p' "$CONF"
}

# probe_cgroups: cgroup_mode 'cgroup' when slurmd may make its cgroup v1
# hierarchies here (each controller mounted and writable: one probe folder
# made and removed), else 'none' with the reason in cgroup_reason.
probe_cgroups() {
  local controller probe
  cgroup_mode=none cgroup_reason=""
  if [[ "$CGROUPS" == no ]]; then
    cgroup_reason="HPC_CLUSTER_CGROUPS=no"
    return 0
  fi
  for controller in "${CGROUP_CONTROLLERS[@]}"; do
    probe="/sys/fs/cgroup/$controller/hpc-local-cluster-probe.$$"
    if ! awk -v dir="/sys/fs/cgroup/$controller" -v c="$controller" \
      '$2 == dir && $3 == "cgroup" && ("," $4 ",") ~ ("," c ",") { found = 1 } END { exit !found }' /proc/mounts; then
      cgroup_reason="no cgroup v1 '$controller' controller at /sys/fs/cgroup/$controller"
      return 0
    fi
    if ! mkdir "$probe" 2>/dev/null; then
      cgroup_reason="cannot create a cgroup under /sys/fs/cgroup/$controller"
      return 0
    fi
    rmdir "$probe" 2>/dev/null || true
  done
  cgroup_mode=cgroup
}

# mount_cgroups: this cluster's cgroup folder in each controller's hierarchy,
# bind-mounted under CGROUP_ROOT (see CGROUP_ROOT); where the sandbox forbids
# that, cgroup_mode 'none' with the reason. A cpuset folder starts with no
# CPUs and no memory nodes: it gets its parent's.
mount_cgroups() {
  local controller hierarchy mount_dir file
  for controller in "${CGROUP_CONTROLLERS[@]}"; do
    hierarchy="/sys/fs/cgroup/$controller/$CGROUP_NAME"
    mount_dir="$CGROUP_ROOT/$controller"
    mkdir -p "$hierarchy" "$mount_dir" || die "cannot create $hierarchy or $mount_dir"
    if [[ "$controller" == cpuset ]]; then
      for file in cpuset.cpus cpuset.mems; do
        [[ -n "$(<"$hierarchy/$file")" ]] || cat "/sys/fs/cgroup/cpuset/$file" >"$hierarchy/$file" ||
          die "cannot set $hierarchy/$file"
      done
    fi
    if ! mountpoint -q "$mount_dir" && ! mount --bind "$hierarchy" "$mount_dir" 2>/dev/null; then
      unmount_cgroups
      cgroup_mode=none cgroup_reason="cannot bind-mount $hierarchy at $mount_dir"
      return 0
    fi
  done
}

# unmount_cgroups: undo mount_cgroups once the daemons have stopped: the bind
# mounts go, and this cluster's cgroup folders, emptied of the node cgroups
# slurmd left (deepest first; a folder with a process in it stays).
unmount_cgroups() {
  local controller hierarchy mount_dir
  for controller in "${CGROUP_CONTROLLERS[@]}"; do
    hierarchy="/sys/fs/cgroup/$controller/$CGROUP_NAME"
    mount_dir="$CGROUP_ROOT/$controller"
    ! mountpoint -q "$mount_dir" 2>/dev/null || umount "$mount_dir" || true
    [[ ! -d "$hierarchy" ]] || find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# start_mariadb: the cluster's own MariaDB (datadir, socket, port and pid
# file under db/; never the machine's), made on the first 'up'.
start_mariadb() {
  local pidfile="$DB_DIR/mariadbd.pid"
  if pidfile_alive "$pidfile"; then
    return 0
  fi
  mkdir -p "$DB_DIR"
  chmod 0700 "$DB_DIR"
  if [[ ! -d "$DB_DIR/data/mysql" ]]; then
    mariadb-install-db --no-defaults --datadir="$DB_DIR/data" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$CLUSTER_DIR/log/mariadb-install-db.log" 2>&1 ||
      die "mariadb-install-db failed; see $CLUSTER_DIR/log/mariadb-install-db.log"
  fi
  # mariadbd stays in the foreground: setsid --fork puts it in the background
  # with no shell of ours left holding the caller's pipes. A small buffer
  # pool: the database holds a few thousand jobs at most.
  detached setsid --fork mariadbd --no-defaults --user=root --datadir="$DB_DIR/data" \
    --socket="$DB_SOCKET" --port="$(db_port)" --bind-address=127.0.0.1 --skip-name-resolve \
    --pid-file="$pidfile" --log-error="$CLUSTER_DIR/log/mariadbd.log" --skip-log-bin \
    --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 2>>"$CLUSTER_DIR/log/mariadbd.log" ||
    die "mariadbd did not start; see $CLUSTER_DIR/log/mariadbd.log"
  wait_for mariadbd 60 mariadb --no-defaults --socket="$DB_SOCKET" -u root -e 'SELECT 1' ||
    die "MariaDB does not answer on $DB_SOCKET after 60 s; see $CLUSTER_DIR/log/mariadbd.log"
}

# write_slurmdbd_conf: slurmdbd.conf (mode 0600: it holds the database
# password), with the database user it names; slurmdbd finds it beside
# SLURM_CONF.
write_slurmdbd_conf() {
  local pass
  if [[ ! -s "$DB_DIR/slurm.pass" ]]; then
    (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DB_DIR/slurm.pass") ||
      die "cannot write $DB_DIR/slurm.pass"
  fi
  pass=$(<"$DB_DIR/slurm.pass")
  # On stdin, never in argv: other users can read a process's arguments.
  mariadb --no-defaults --socket="$DB_SOCKET" -u root <<SQL || die "cannot create the database user 'slurm'; see $CLUSTER_DIR/log/mariadbd.log"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
  write_file "$CLUSTER_DIR/etc/slurmdbd.conf" 0600 <<EOF
# Written by local_cluster/cluster.sh; edits are overwritten by the next 'up'.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$(dbd_port)
SlurmUser=root
LogFile=$CLUSTER_DIR/log/slurmdbd.log
PidFile=$CLUSTER_DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$(db_port)
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
}

start_slurmdbd() {
  if pidfile_alive "$CLUSTER_DIR/run/slurmdbd.pid"; then
    return 0
  fi
  detached slurmdbd || die "slurmdbd did not start; see $CLUSTER_DIR/log/slurmdbd.log"
  wait_for slurmdbd 30 sacctmgr -n show cluster ||
    die "slurmdbd does not answer 'sacctmgr show cluster' after 30 s; see $CLUSTER_DIR/log/slurmdbd.log"
}

# ensure_accounts: the cluster, the accounts, and the user in each of them
# (the first the default), as a new Compute Canada user has them.
ensure_accounts() {
  local user account have
  user=$(id -un)
  if ! sacctmgr -nP show cluster format=cluster | grep -qx hpclocal; then
    sacctmgr -i add cluster hpclocal >/dev/null || die "sacctmgr could not add the cluster 'hpclocal'"
  fi
  have=" $(sacctmgr -nP show assoc cluster=hpclocal user="$user" format=account | tr '\n' ' ')"
  for account in "${ACCOUNTS[@]}"; do
    [[ "$have" != *" $account "* ]] || continue
    if ! sacctmgr -nP show account "$account" format=account | grep -qx "$account"; then
      sacctmgr -i add account "$account" Cluster=hpclocal Description="local cluster account" Organization=local >/dev/null ||
        die "sacctmgr could not add the account '$account'"
    fi
    sacctmgr -i add user "$user" Account="$account" DefaultAccount="${ACCOUNTS[0]}" Cluster=hpclocal >/dev/null ||
      die "sacctmgr could not add the user '$user' to the account '$account'"
  done
}

start_slurmctld() {
  if pidfile_alive "$CLUSTER_DIR/run/slurmctld.pid"; then
    return 0
  fi
  detached slurmctld -f "$CONF" || die "slurmctld did not start; see $CLUSTER_DIR/log/slurmctld.log"
  wait_for slurmctld 20 scontrol ping ||
    die "slurmctld does not answer 'scontrol ping' after 20 s; see $CLUSTER_DIR/log/slurmctld.log"
}

start_slurmds() {
  local i name
  for ((i = 1; i <= NODE_COUNT; i++)); do
    name="node$i"
    if pidfile_alive "$CLUSTER_DIR/run/slurmd-$name.pid"; then
      continue
    fi
    mkdir -p "$CLUSTER_DIR/spool/$name"
    detached slurmd -f "$CONF" -N "$name" || die "slurmd -N $name did not start; see $CLUSTER_DIR/log/slurmd-$name.log"
  done
}

all_nodes_idle() {
  local states
  states=$(sinfo -h -N -p tmpdir -o '%T' 2>/dev/null | sort -u)
  [[ -n "$states" ]] || return 1
  # 'mixed'/'allocated' nodes are up too (idempotent 'up' with jobs running).
  ! grep -qvE '^(idle|mixed|allocated|completing)$' <<<"$states"
}

wait_nodes_up() {
  local name
  if ! wait_for "nodes idle" "$WAIT_SECONDS" all_nodes_idle; then
    # Nodes left DOWN by an earlier run come back once asked.
    for name in $(node_names); do
      scontrol update NodeName="$name" State=RESUME >/dev/null 2>&1 || true
    done
    wait_for "nodes idle" 15 all_nodes_idle ||
      die "nodes are not idle after ${WAIT_SECONDS}s: $(sinfo -h -N -o '%N=%T' | tr '\n' ' ')(see $CLUSTER_DIR/log/)"
  fi
}

cmd_up() {
  local recorded
  check_prerequisites
  export SLURM_CONF="$CONF"
  recorded=$(recorded_shape)
  if [[ -n "$recorded" && "$recorded" != "$SHAPE" ]] && any_daemon_alive; then
    die "this cluster runs in the $recorded shape; 'cluster.sh down' first to start it in the $SHAPE shape"
  fi
  mkdir -p "$CLUSTER_DIR"/{etc,state,spool,run,log,local} "$MUNGE_DIR"
  chmod 0700 "$MUNGE_DIR"
  ensure_hosts_entries
  choose_ports probe
  probe_cgroups
  write_slurm_conf "$cgroup_mode"
  check_ports
  # Mounted only once 'up' goes on (a refused 'up' leaves no mount behind);
  # a refused bind mount means no cgroups, so slurm.conf is written again.
  if [[ "$cgroup_mode" == cgroup ]]; then
    mount_cgroups
    [[ "$cgroup_mode" == cgroup ]] || write_slurm_conf "$cgroup_mode"
  fi
  start_munge
  if [[ "$SHAPE" == production ]]; then
    start_mariadb
    write_slurmdbd_conf
    start_slurmdbd
    ensure_accounts
  fi
  start_slurmctld
  start_slurmds
  wait_nodes_up
  info "up ($SHAPE shape): $NODE_COUNT nodes x $NODE_CPUS CPUs x $NODE_GPUS fake GPUs; partitions tmpdir (default, SLURM_TMPDIR), notmpdir, urgent"
  if [[ "$SHAPE" == production ]]; then
    if [[ "$cgroup_mode" == cgroup ]]; then
      info "cgroups: proctrack/cgroup, task/affinity,task/cgroup (cores, memory and fake GPU devices constrained)"
    else
      info "cgroups: not available ($cgroup_reason); proctrack/linuxproc, task/none: nothing constrained"
    fi
    info "accounting: slurmdbd on port $(dbd_port), MariaDB on port $(db_port); accounts ${ACCOUNTS[*]} (default ${ACCOUNTS[0]})"
  fi
  info "clients need: $(env_lines | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
}

# env_lines: the exports a client (and the jobs it submits) needs.
env_lines() {
  echo "export SLURM_CONF=$CONF"
  [[ -z "$SLURM_PREFIX" ]] || echo "export PATH=$SLURM_PREFIX/bin:\$PATH"
}

stop_pidfile() {
  local pidfile=$1 what=$2 pid
  pidfile_alive "$pidfile" || {
    rm -f "$pidfile"
    return 0
  }
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_for "$what to stop" 20 bash -c "! kill -0 $pid"; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  info "stopped $what (pid $pid)"
}

cmd_down() {
  local jobs name
  export SLURM_CONF="$CONF"
  if pidfile_alive "$CLUSTER_DIR/run/slurmctld.pid"; then
    jobs=$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')
    if [[ -n "${jobs// /}" ]]; then
      # shellcheck disable=SC2086 # a list of numeric job ids, split on purpose
      scancel $jobs 2>/dev/null || true
    fi
  fi
  for name in $(node_names); do
    stop_pidfile "$CLUSTER_DIR/run/slurmd-$name.pid" "slurmd $name"
  done
  stop_pidfile "$CLUSTER_DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$CLUSTER_DIR/run/slurmdbd.pid" slurmdbd
  stop_pidfile "$DB_DIR/mariadbd.pid" mariadbd
  stop_pidfile "$MUNGE_DIR/munged.pid" munged
  unmount_cgroups
}

cmd_status() {
  local name rc=0
  export SLURM_CONF="$CONF"
  local daemons=(munged)
  [[ "$(recorded_shape)" != production ]] || daemons+=(mariadbd slurmdbd)
  for name in "${daemons[@]}" slurmctld $(node_names); do
    local pidfile
    case "$name" in
      munged) pidfile="$MUNGE_DIR/munged.pid" ;;
      mariadbd) pidfile="$DB_DIR/mariadbd.pid" ;;
      slurmdbd) pidfile="$CLUSTER_DIR/run/slurmdbd.pid" ;;
      slurmctld) pidfile="$CLUSTER_DIR/run/slurmctld.pid" ;;
      *) pidfile="$CLUSTER_DIR/run/slurmd-$name.pid" ;;
    esac
    if pidfile_alive "$pidfile"; then
      printf '%-10s running (pid %s)\n' "$name" "$(<"$pidfile")"
    else
      printf '%-10s stopped\n' "$name"
      rc=1
    fi
  done
  if ((rc == 0)); then
    sinfo -o '%10P %6a %5D %10T %N' || rc=1
  fi
  return "$rc"
}

main() {
  case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) env_lines ;;
    ports)
      choose_ports probe
      echo "slurmctld $CTLD_PORT"
      echo "slurmd $NODE_PORT-$(node_port "$NODE_COUNT")"
      echo "slurmdbd $(dbd_port)"
      echo "mariadbd $(db_port)"
      echo "first job id $(first_job_id)"
      ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
    *)
      echo "$PROG: error: expected one of up, down, status, env, ports; got '${1:-}'" >&2
      exit 2
      ;;
  esac
}

main "$@"
