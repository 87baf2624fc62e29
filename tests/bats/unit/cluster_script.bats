#!/usr/bin/env bats
# local_cluster/cluster.sh argument handling and refusals (no daemons started).

load '../test_helper'

@test "cluster.sh with no command exits 2 with one line" {
  run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh"
  assert_failure 2
  assert_equal "$stderr" "cluster.sh: error: expected one of up, down, status, env, ports; got ''"
}

@test "cluster.sh env prints the SLURM_CONF export" {
  HPC_CLUSTER_DIR=/tmp/somewhere run "$REPO_ROOT/local_cluster/cluster.sh" env
  assert_success
  assert_output "export SLURM_CONF=/tmp/somewhere/etc/slurm.conf"
}

@test "cluster.sh env under SLURM_PREFIX: its own state folder, and that SLURM first on PATH" {
  local prefix="$BATS_TEST_TMPDIR/slurm-24.11"
  mkdir -p "$prefix/bin" "$prefix/sbin"
  printf '#!/bin/sh\n' | tee "$prefix/bin/sinfo" >"$prefix/sbin/slurmctld"
  chmod +x "$prefix/bin/sinfo" "$prefix/sbin/slurmctld"
  SLURM_PREFIX="$prefix" run "$REPO_ROOT/local_cluster/cluster.sh" env
  assert_success
  assert_line --index 0 "export SLURM_CONF=$REPO_ROOT/.cluster-24.11/etc/slurm.conf"
  assert_line --index 1 "export PATH=$prefix/bin:\$PATH"
}

@test "cluster.sh refuses a SLURM_PREFIX without slurmctld and sinfo" {
  SLURM_PREFIX="$BATS_TEST_TMPDIR/none" run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh" env
  assert_failure 1
  assert_equal "$stderr" "cluster.sh: error: SLURM_PREFIX '$BATS_TEST_TMPDIR/none' has no sbin/slurmctld and bin/sinfo"
}

# hold_port PORT: a listener on PORT until the test ends (holder_pid; the
# teardown kills it). The wait for it to listen is long: make test runs the
# unit tests under nice beside the cluster suites, and a python starting
# there may wait seconds for a core.
hold_port() {
  python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0",int(sys.argv[1]))); s.listen(); time.sleep(600)' "$1" &
  holder_pid=$!
  local deadline=$((SECONDS + 60))
  until ss -Hltn "sport = :$1" | grep -q .; do
    ((SECONDS < deadline)) || fail "port holder did not start listening"
    sleep 0.1
  done
}

teardown() {
  [[ -z "${holder_pid:-}" ]] || { kill "$holder_pid" && wait "$holder_pid"; } 2>/dev/null || true
}

# ports_of DIR [VAR=VALUE...]: 'cluster.sh ports' for a cluster in DIR, one line.
ports_of() {
  local dir=$1
  shift
  env -u HPC_CLUSTER_CTLD_PORT -u HPC_CLUSTER_NODE_PORT HPC_CLUSTER_DIR="$dir" "$@" \
    "$REPO_ROOT/local_cluster/cluster.sh" ports | tr '\n' ' '
}

@test "cluster.sh ports: two clusters' folders get their own block of ports, the same at every call; each knob wins" {
  local a b
  # Folders whose hashes fall in different blocks (cksum is fixed).
  a=$(ports_of /tmp/hpc-cluster-a)
  b=$(ports_of /tmp/hpc-cluster-b HPC_CLUSTER_NODES=3)

  [[ "${a%% slurmd *}" != "${b%% slurmd *}" ]] || fail "both folders got $a"
  assert_equal "$(ports_of /tmp/hpc-cluster-a)" "$a"
  # slurmdbd and MariaDB take the two ports after slurmctld's; 3 nodes, 3 slurmd ports.
  local ctld=${b#slurmctld }
  ctld=${ctld%% *}
  assert_equal "${b% first job id *}" "slurmctld $ctld slurmd $((ctld + 8))-$((ctld + 10)) slurmdbd $((ctld + 1)) mariadbd $((ctld + 2))"
  local b_node
  b_node=$(ports_of /tmp/hpc-cluster-b HPC_CLUSTER_NODE_PORT=27001)
  assert_equal "${b_node% first job id *}" "slurmctld $ctld slurmd 27001-27002 slurmdbd $((ctld + 1)) mariadbd $((ctld + 2))"
}

@test "cluster.sh ports: a block another program holds a port of is skipped for the next, and so is its first job id" {
  local before after node
  before=$(ports_of /tmp/hpc-cluster-a)
  node=${before#* slurmd }
  node=${node%%-*}
  hold_port $((node + 1))
  after=$(ports_of /tmp/hpc-cluster-a)
  [[ "$after" != "$before" ]] || fail "the held port $((node + 1)) is still in: $after"
  assert_regex "$after" '^slurmctld 3[0-9]{4} '
  # Another cluster whose folder hashes to the same block gets other job ids.
  [[ "${after#* first job id }" != "${before#* first job id }" ]] || fail "the same first job id in another block: $after"
}

@test "cluster.sh ports: the ports an earlier 'up' wrote into slurm.conf are kept, unless another program took one" {
  unset HPC_CLUSTER_CTLD_PORT HPC_CLUSTER_NODE_PORT
  local dir="$BATS_TEST_TMPDIR/c"
  mkdir -p "$dir/etc"
  printf '%s\n' 'SlurmctldPort=30517' 'NodeName=node[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=30601-30602 CPUs=8' >"$dir/etc/slurm.conf"
  HPC_CLUSTER_DIR=$dir run "$REPO_ROOT/local_cluster/cluster.sh" ports
  assert_line --index 0 'slurmctld 30517'
  assert_line --index 1 'slurmd 30601-30602'
  hold_port 30602
  HPC_CLUSTER_DIR=$dir run "$REPO_ROOT/local_cluster/cluster.sh" ports
  refute_output --partial 30517
  assert_output --regexp $'^slurmctld 3[0-9]{4}\nslurmd 3[0-9]{4}-3[0-9]{4}\n'
}

@test "cluster.sh up refuses a state folder slurm.conf cannot quote" {
  HPC_CLUSTER_DIR="/tmp/with space" run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh" up
  assert_failure 1
  assert_equal "${#stderr_lines[@]}" 1
  assert_regex "$stderr" "^cluster.sh: error: HPC_CLUSTER_DIR must be an absolute path"
}

@test "cluster.sh up refuses a port that another program holds" {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  hold_port "$port"
  HPC_CLUSTER_DIR="$BATS_TEST_TMPDIR/c" HPC_CLUSTER_CTLD_PORT="$port" \
    run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh" up
  HPC_CLUSTER_DIR="$BATS_TEST_TMPDIR/c" "$REPO_ROOT/local_cluster/cluster.sh" down >/dev/null
  assert_failure 1
  assert_regex "$stderr" "port $port \(slurmctld\) is in use by another program"
}

@test "cluster.sh up as a non-root user says so in one line" {
  command -v setpriv >/dev/null || skip "setpriv is not installed"
  run --separate-stderr setpriv --reuid=65534 --regid=65534 --clear-groups \
    env HPC_CLUSTER_DIR="$BATS_TEST_TMPDIR/c" "$REPO_ROOT/local_cluster/cluster.sh" up
  assert_failure 1
  assert_equal "${#stderr_lines[@]}" 1
  assert_regex "$stderr" "^cluster.sh: error: the local cluster runs its daemons as root"
}

@test "cluster.sh up refuses an unknown shape or cgroups knob in one line" {
  HPC_CLUSTER_DIR="$BATS_TEST_TMPDIR/c" HPC_CLUSTER_SHAPE=huge run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh" up
  assert_failure 1
  assert_equal "$stderr" "cluster.sh: error: HPC_CLUSTER_SHAPE must be production or friendly, got 'huge'"
  HPC_CLUSTER_DIR="$BATS_TEST_TMPDIR/c" HPC_CLUSTER_CGROUPS=yes run --separate-stderr "$REPO_ROOT/local_cluster/cluster.sh" up
  assert_failure 1
  assert_equal "$stderr" "cluster.sh: error: HPC_CLUSTER_CGROUPS must be auto or no, got 'yes'"
}
