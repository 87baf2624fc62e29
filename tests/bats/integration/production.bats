#!/usr/bin/env bats
# The production shape of the local cluster (local_cluster/cluster.sh, the
# default): accounts enforced through slurmdbd, sacct, memory and time
# limits, cgroups where the kernel allows; and the submitter's refusal of a
# time over MaxTime, in one line before anything is submitted. A wrong
# account and a job over its memory are faults of the reliability suite.

load '../test_helper'

setup() {
  cluster_test_setup
  config=$(scontrol show config)
  [[ "$config" == *"AccountingStorageType   = accounting_storage/slurmdbd"* ]] ||
    skip "the cluster in use ($SLURM_CONF) is not production-shaped (HPC_CLUSTER_SHAPE=friendly?)"
}

teardown() {
  cancel_test_jobs
}

# uses_cgroups: the cluster's up found cgroups it could use.
uses_cgroups() {
  [[ "$config" == *"ProctrackType           = proctrack/cgroup"* ]]
}

# wait_sacct JOB SECONDS REGEX: poll 'sacct -X -n -P -o State,Account' for JOB until it matches.
wait_sacct() {
  local job=$1 deadline=$((SECONDS + $2)) line=""
  while ((SECONDS < deadline)); do
    line=$(sacct -X -n -P -j "$job" -o State,Account 2>/dev/null | head -n 1)
    [[ "$line" =~ $3 ]] && return 0
    sleep 0.5
  done
  fail "sacct did not show job $job as '$3' within $2 s (last: '$line')"
}

@test "memory is a consumable resource and partitions have limits" {
  assert_regex "$config" $'SelectTypeParameters[[:space:]]+= CR_CORE_MEMORY'
  assert_regex "$config" $'DefMemPerCPU[[:space:]]+= [0-9]+'
  assert_regex "$config" $'AccountingStorageEnforce[[:space:]]+= associations,limits,qos'
  run scontrol show partition -o tmpdir
  assert_output --regexp ' MaxTime=1-00:00:00 '
  assert_output --regexp ' DefaultTime=01:00:00 '
  assert_output --regexp ' MaxMemPerNode=[0-9]+ '
}

@test "sacct keeps a finished job with its account; the scheduler refuses an account the user does not have" {
  local job
  job=$(sbatch --parsable -A rrg-lab -o /dev/null --wrap true)
  wait_job_done "$job" 60
  wait_sacct "$job" 60 '^COMPLETED\|rrg-lab$'
  run sbatch --parsable -A no-such-account -o /dev/null --wrap true
  assert_failure
  assert_output --partial "Invalid account"
}

@test "the submitter refuses a time over the partition's MaxTime with both numbers" {
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -t 2-00:00:00 -W none -g 0 -- true
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --time 2-00:00:00 (172800 s) is over the MaxTime of partition 'notmpdir', 1-00:00:00 (86400 s); lower -t or pick another partition with -p"
}

@test "cgroups: a job over its memory is killed as OUT_OF_MEMORY, and sees only its own fake GPUs" {
  uses_cgroups || skip "this cluster runs without cgroups (see 'cluster.sh up')"
  local job out="$BATS_TEST_TMPDIR/gpu.out"
  job=$(sbatch --parsable --mem=64M -o /dev/null --wrap \
    "python3 -c 'import time; x = bytearray(512 * 1024 * 1024); time.sleep(5)'")
  wait_job_done "$job" 60
  assert_equal "$(job_state "$job")" OUT_OF_MEMORY
  job=$(sbatch --parsable --gres=gpu:1 -o "$out" --wrap \
    'echo "visible=$CUDA_VISIBLE_DEVICES"; for d in /dev/tty0 /dev/tty1 /dev/tty2 /dev/tty3; do if (: <"$d"); then echo "open $d"; else echo "denied $d"; fi; done 2>/dev/null')
  wait_job_done "$job" 60
  assert_equal "$(job_state "$job")" COMPLETED
  # One device of the four opens (which one is the scheduler's choice). The
  # test opens each in a subshell: in sh a failed redirection on ":" ends the shell.
  assert_equal "$(grep -c '^open ' "$out")" 1
  assert_equal "$(grep -c '^denied ' "$out")" 3
}
