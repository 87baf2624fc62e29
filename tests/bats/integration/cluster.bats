#!/usr/bin/env bats
# The local cluster itself: two nodes, fake GPUs through GRES, two site
# flavours (SLURM_TMPDIR provided or not). Submits with plain sbatch on purpose.

load '../test_helper'

setup() {
  require_cluster
}

teardown() {
  # The second cluster a test started (its own folder), stopped whatever happened.
  [[ -z "${second+x}" ]] || "${second[@]}" down >/dev/null 2>&1 || true
}

submit_probe() {
  local partition=$1 out=$2
  sbatch --parsable -p "$partition" --nodes=2 --ntasks-per-node=2 --cpus-per-task=3 \
    --gres=gpu:2 --time=00:02:00 -o "$out" --wrap \
    'srun bash -c '"'"'echo "task node=$SLURMD_NODENAME procid=$SLURM_PROCID localid=$SLURM_LOCALID gpus=$CUDA_VISIBLE_DEVICES ongpus=$SLURM_GPUS_ON_NODE cpus=$SLURM_CPUS_PER_TASK tmpdir=${SLURM_TMPDIR:-none}"'"'"
}

@test "a 2-node job with 2 fake GPUs per node sees its layout; SLURM_TMPDIR only on the tmpdir partition" {
  local job_a job_b out_a="$BATS_TEST_TMPDIR/a.out" out_b="$BATS_TEST_TMPDIR/b.out"
  job_a=$(submit_probe tmpdir "$out_a")
  job_b=$(submit_probe notmpdir "$out_b")
  wait_job_done "$job_a" 60
  wait_job_done "$job_b" 60
  assert_equal "$(job_field "$job_a" JobState)" COMPLETED
  assert_equal "$(job_field "$job_b" JobState)" COMPLETED

  run grep -c '^task ' "$out_a"
  assert_output 4
  for rank in 0 1; do
    assert_file_contains "$out_a" "node=node1 procid=$rank localid=$rank gpus=[0-3],[0-3] ongpus=2 cpus=3 tmpdir=.*/node1/job$job_a\$"
  done
  for rank in 2 3; do
    assert_file_contains "$out_a" "node=node2 procid=$rank localid=$((rank - 2)) gpus=[0-3],[0-3] ongpus=2 cpus=3 tmpdir=.*/node2/job$job_a\$"
  done
  run grep -c 'tmpdir=none$' "$out_b"
  assert_output 4
}

@test "the site's SLURM_TMPDIR is removed by the epilog when the job ends" {
  local job out="$BATS_TEST_TMPDIR/t.out"
  job=$(sbatch --parsable -p tmpdir --nodes=1 -o "$out" --wrap 'echo "dir=$SLURM_TMPDIR"; test -d "$SLURM_TMPDIR"')
  wait_job_done "$job" 60
  assert_equal "$(job_field "$job" JobState)" COMPLETED
  local dir
  dir=$(sed -n 's/^dir=//p' "$out")
  [[ -n "$dir" ]] || fail "job printed no SLURM_TMPDIR"
  # The epilog runs as the job completes; poll briefly for it.
  local deadline=$((SECONDS + 20))
  while [[ -e "$dir" ]] && ((SECONDS < deadline)); do sleep 0.2; done
  assert_not_exist "$dir"
}

@test "the scheduler refuses more fake GPUs than a node has" {
  run sbatch --parsable --nodes=1 --gres=gpu:5 --wrap true
  assert_failure
  assert_output --partial "Requested node configuration is not available"
}

@test "node names resolve, so MASTER_ADDR can be a node name" {
  run getent hosts node1
  assert_success
  assert_output --regexp '^127\.'
}

@test "munge stopped: status reports it, and an idempotent 'up' brings it back without touching the other daemons" {
  # The cluster in use (SLURM_CONF), if this checkout started it: .cluster, or
  # .cluster-24.11 under SLURM_PREFIX (make test-portability).
  local dir="${SLURM_CONF%/etc/slurm.conf}" munge_pid ctld_pid
  [[ "$dir" == "$REPO_ROOT"/.cluster* && -s "$dir/munge/munged.pid" ]] ||
    skip "the cluster in use ($SLURM_CONF) was not started from this checkout, and this test restarts its munged"
  local -a cluster=(env HPC_CLUSTER_DIR="$dir" "$REPO_ROOT/local_cluster/cluster.sh")
  munge_pid=$(<"$dir/munge/munged.pid")
  ctld_pid=$(<"$dir/run/slurmctld.pid")
  kill "$munge_pid"
  local deadline=$((SECONDS + 10))
  while kill -0 "$munge_pid" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "munged did not stop"
    sleep 0.1
  done
  run "${cluster[@]}" status
  assert_failure 1
  assert_line --regexp '^munged +stopped$'
  run "${cluster[@]}" up
  assert_success
  run "${cluster[@]}" status
  assert_success
  assert_equal "$(<"$dir/run/slurmctld.pid")" "$ctld_pid"
  run sbatch --parsable -o /dev/null --wrap true
  assert_success
}

@test "--stage-out copies a results folder from the node-local folder back to scratch at the end" {
  cluster_test_setup
  submit -p notmpdir -n 1 -g 1 -W none -t 5 -e stageout --stage-out results -- \
    bash -c 'mkdir -p "$SLURM_TMPDIR/results" && echo "from $SLURMD_NODENAME" >"$SLURM_TMPDIR/results/out.txt"'
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  assert_file_contains "$SCRATCH/$project/stageout/results/out.txt" '^from node1$'
}

@test "a second cluster in another folder shares nothing: its own ports, job ids and node-local folders" {
  cluster_test_setup
  local dir="$BATS_TEST_TMPDIR/second" first_conf=$SLURM_CONF first_job
  [[ "$dir" =~ ^/[A-Za-z0-9._/-]+$ ]] || skip "BATS_TEST_TMPDIR ($dir) is not a path slurm.conf can hold"
  second=(env -u HPC_CLUSTER_CTLD_PORT -u HPC_CLUSTER_NODE_PORT HPC_CLUSTER_DIR="$dir" HPC_CLUSTER_NODES=1
    "$REPO_ROOT/local_cluster/cluster.sh")
  run "${second[@]}" up
  assert_success
  run "${second[@]}" ports
  refute_line "slurmctld $(sed -n 's/^SlurmctldPort=//p' "$first_conf")"
  local probe='echo "tmp=$SLURM_TMPDIR"'
  submit -p notmpdir -n 1 -g 0 -W none -t 5 -e first -- bash -c "$probe"
  first_job=$job_id
  SLURM_CONF="$dir/etc/slurm.conf" submit -p notmpdir -n 1 -g 0 -W none -t 5 -e second -- bash -c "$probe"
  [[ "$job_id" != "$first_job" ]] || fail "both clusters gave job id $job_id"
  SLURM_CONF="$dir/etc/slurm.conf" wait_job_done "$job_id" 60
  SLURM_CONF="$dir/etc/slurm.conf" assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --regexp "tmp=$dir/local-ssd/$(id -un)/$job_id/node1"$'(\n|$)'
  wait_job_done "$first_job" 60
  assert_job_state "$first_job" COMPLETED
  run job_log "$first_job"
  assert_output --regexp "tmp=${first_conf%/etc/slurm.conf}/local-ssd/$(id -un)/$first_job/node1"$'(\n|$)'
}
