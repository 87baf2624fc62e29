#!/usr/bin/env bats
# job_submitter.sh against the real local cluster: the scheduler accepts the
# layouts it renders, every task sees the ranks, GPUs and CPUs it should, and
# a failed program ends the job FAILED with the program's exit code.

load '../test_helper'

PROGRAMS="$REPO_ROOT/tests/bats/fixtures/programs"

teardown() {
  cancel_test_jobs
}

setup() {
  require_cluster
  make_scratch
  export HPC_EXP_LOG="$BATS_TEST_TMPDIR/submit.out"
}

# submit ARGS...: job_submitter.sh --site local ... --wait; sets job_id, status.
submit_and_wait() {
  status=0
  "$SUBMITTER" --site local --time 00:05:00 --signal-lead 60 --wait "$@" >"$HPC_EXP_LOG" 2>&1 || status=$?
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' "$HPC_EXP_LOG")
  [[ -n "$job_id" ]] || fail "no job id in the submitter's output: $(cat "$HPC_EXP_LOG")"
}


@test "lightning 2 nodes x 2 GPUs: one task per GPU, ranks 0-3, each with its GPUs and CPUs" {
  # Which 2 of a node's 4 fake GPUs: whichever a job still ending left free.
  submit_and_wait -n 2 -g 2 -c 3 -W lightning -e lt -- "$PROGRAMS/probe.sh"
  assert_equal "$status" 0
  run job_log "$job_id"
  assert_line --regexp '^probe rank=0 procid=0 localid=0 local_rank= world=4 node=node1 gpus=[0-3],[0-3] cpus=3 '
  assert_line --regexp '^probe rank=1 procid=1 localid=1 local_rank= world=4 node=node1 gpus=[0-3],[0-3] cpus=3 '
  assert_line --regexp '^probe rank=2 procid=2 localid=0 local_rank= world=4 node=node2 gpus=[0-3],[0-3] cpus=3 '
  assert_line --regexp '^probe rank=3 procid=3 localid=1 local_rank= world=4 node=node2 gpus=[0-3],[0-3] cpus=3 '
  assert_equal "$(grep -c '^probe rank=' <<<"$output")" 4
  assert_equal "$(job_field "$job_id" NumNodes)" 2
}

@test "torchrun 2 nodes x 2 GPUs: one task per node with all CPUs; torchrun starts 2 workers per node" {
  submit_and_wait -n 2 -g 2 -c 2 -W torchrun -e tr -- "$PROGRAMS/probe.sh"
  assert_equal "$status" 0
  run job_log "$job_id"
  # One srun task per node (SLURM_PROCID = node index), 4 CPUs each; c10d
  # rendezvous gives the global ranks in whichever order the nodes joined.
  assert_line --regexp '^probe rank=[0-3] procid=0 localid=0 local_rank=0 world=4 node=node1 gpus=[0-3],[0-3] cpus=4 '
  assert_line --regexp '^probe rank=[0-3] procid=0 localid=0 local_rank=1 world=4 node=node1 gpus=[0-3],[0-3] cpus=4 '
  assert_line --regexp '^probe rank=[0-3] procid=1 localid=0 local_rank=0 world=4 node=node2 gpus=[0-3],[0-3] cpus=4 '
  assert_line --regexp '^probe rank=[0-3] procid=1 localid=0 local_rank=1 world=4 node=node2 gpus=[0-3],[0-3] cpus=4 '
  assert_equal "$(grep -o '^probe rank=[0-9]*' <<<"$output" | sort | tr '\n' ' ')" \
    "probe rank=0 probe rank=1 probe rank=2 probe rank=3 "
}

@test "CPU-only (-g 0): no GRES, one task per node with the CPUs asked for" {
  submit_and_wait -n 2 -g 0 -c 2 -W torchrun -e cpu -- "$PROGRAMS/probe.sh"
  assert_equal "$status" 0
  run job_log "$job_id"
  assert_line --regexp '^probe rank=[01] procid=0 .* world=2 node=node1 gpus= cpus=2 '
  assert_line --regexp '^probe rank=[01] procid=1 .* world=2 node=node2 gpus= cpus=2 '
  run scontrol show job "$job_id"
  refute_output --partial 'gres/gpu'
}

@test "a program exiting 3 ends the job FAILED with exit code 3, and --wait returns 3" {
  submit_and_wait -n 1 -g 1 -W none -e fail -- bash -c 'echo failing on purpose; exit 3'
  assert_equal "$status" 3
  assert_job_state "$job_id" FAILED
  assert_equal "$(job_field "$job_id" ExitCode)" 3:0
  run job_log "$job_id"
  assert_output --partial 'training step ended with exit code 3'
}

@test "one failing rank ends the whole 2-node step; the log names the rank that failed first" {
  submit_and_wait -n 2 -g 2 -c 1 -W lightning -e rankfail -- \
    bash -c 'if [ "$SLURM_PROCID" = 2 ]; then exit 7; fi; sleep 60'
  assert_equal "$status" 7
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --regexp 'task2 on node2 exited first, with code 7'
}

@test "the impossible request (5 GPUs on a 4-GPU node) is refused before sbatch" {
  run --separate-stderr "$SUBMITTER" --site local -g 5 -- true
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --gpus must be at most 4, got '5'"
}

@test "configs with several lines run as one array job, one line per task" {
  local configs="$BATS_TEST_TMPDIR/configs.txt"
  printf '%s\n' '# three experiments' \
    "bash -c 'echo trial-one \$SLURM_ARRAY_TASK_ID'" \
    "bash -c 'echo trial-two \$SLURM_ARRAY_TASK_ID'" \
    "bash -c 'echo trial-three \$SLURM_ARRAY_TASK_ID'" >"$configs"
  submit_and_wait -n 1 -g 1 -W none -e arr -C "$configs" --array-throttle 2
  assert_equal "$status" 0
  local project=${REPO_ROOT##*/}
  run cat "$SCRATCH/$project/hpc_outputs/${project}_arr_${job_id}_0.out" \
    "$SCRATCH/$project/hpc_outputs/${project}_arr_${job_id}_1.out" \
    "$SCRATCH/$project/hpc_outputs/${project}_arr_${job_id}_2.out"
  assert_line 'trial-one 0'
  assert_line 'trial-two 1'
  assert_line 'trial-three 2'
}

@test "a job runs without the user's login shell (no SLURM_GET_USER_ENV); the contract's variable reaches it" {
  # Any --export list makes sbatch set SLURM_GET_USER_ENV=1, and slurmd then
  # runs 'su - USER' before the job and puts that shell's variables under it.
  submit_and_wait -g 0 -e env -- bash -c 'echo "get_user_env=${SLURM_GET_USER_ENV:-} contract=${HPC_CONTRACT_ON_COMMAND_LINE:-}"'
  assert_equal "$status" 0
  run job_log "$job_id"
  assert_line "get_user_env= contract=1"
}
