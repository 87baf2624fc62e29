#!/usr/bin/env bats
# An experiment as one thing, on the local cluster: a second submission to a
# running experiment is refused naming its job, --after-running queues
# behind it, and stop.sh cancels every job of an experiment; on a method-bayes
# search it stops the search before round 2.

load '../test_helper'

STOP="$REPO_ROOT/hpc_files/stop.sh"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
}

# sleeper_sweep FILE: a method-bayes sweep whose trials sleep (they run
# until cancelled).
sleeper_sweep() {
  cat >"$1" <<'YAML'
program: sleeper
method: bayes
metric:
  name: loss
  goal: minimize
parameters:
  lr:
    distribution: log_uniform_values
    min: 0.0003
    max: 0.03
command: [bash, -c, sleep 300, sleeper, "${args}"]
YAML
}

@test "a second submission to a running experiment is refused naming its job; --after-running queues behind it; stop.sh cancels both" {
  submit -n 1 -g 0 -c 1 -W none -t 5 -e busy -- sleep 300
  local first=$job_id
  wait_job_state "$first" 60 RUNNING
  # batch.sh records the task's SLURM job id (results.sh tells its rows by it).
  wait_log "$first" '^hpc: job ' 60
  assert_equal "$(cat "$(ls -d "$SCRATCH/$project/busy"/20*)/runs/$first/slurm_job_id")" "$first"
  run --separate-stderr "$SUBMITTER" --site local -n 1 -g 0 -c 1 -W none -t 5 -e busy -- sleep 300
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: experiment 'busy' has queued or running job(s) $first; a second submission would share its trial folders and checkpoints: use -e NEW for a new experiment, --after-running to queue behind them, or stop them first: hpc_files/stop.sh busy"
  assert_equal "$(find "$SCRATCH/$project/busy" -mindepth 1 -maxdepth 1 -name '20*' | wc -l)" 1
  submit -n 1 -g 0 -c 1 -W none -t 5 -e busy --after-running -- sleep 300
  local second=$job_id
  assert_equal "$(job_field "$second" Dependency)" "afterany:${first}(unfulfilled)"
  assert_equal "$(job_state "$second")" PENDING
  run "$STOP" busy
  assert_success
  assert_output "Stopped experiment busy: cancelled job(s) $first,$second; recorded in $SCRATCH/$project/busy/stopped"
  wait_job_done "$first" 60
  wait_job_done "$second" 60
  assert_job_state "$first" CANCELLED
  assert_job_state "$second" CANCELLED
}

@test "stop.sh on a method-bayes search (by a trial's job id) stops it before round 2: the round and its controller are cancelled" {
  sleeper_sweep "$BATS_TEST_TMPDIR/sleeper.yml"
  submit -n 1 -g 0 -c 1 -W none -t 5 -e search --sweep "$BATS_TEST_TMPDIR/sleeper.yml" --rounds 2 --trials 2
  local round1 controller
  round1=$(ls -d "$SCRATCH/$project/search"/20*)
  controller=$(cat "$round1/bayes_controller_job_id")
  wait_job_state "${job_id}_0" 60 RUNNING
  run "$STOP" "${job_id}_1"
  assert_success
  assert_output "Stopped experiment search: cancelled job(s) $job_id,$controller; recorded in $SCRATCH/$project/search/stopped"
  wait_job_done "${job_id}_0" 60
  wait_job_done "${job_id}_1" 60
  wait_job_done "$controller" 60
  assert_job_state "$controller" CANCELLED
  assert_job_state "${job_id}_0" CANCELLED
  # No controller ran: round 2 was never asked, nor submitted.
  assert_not_exist "$round1/next_round"
  assert_equal "$(ls -d "$SCRATCH/$project/search"/20*)" "$round1"
}

@test "--fresh applies once per submission folder: 'sbatch job.sbatch' again runs without it and says so" {
  run --separate-stderr "$SUBMITTER" --site local -n 1 -g 0 -c 1 -W none -t 5 -e fresh --no-submit -- bash -c 'echo "args: $*"' prog --fresh --lr 1
  assert_success
  local script=${output##*sbatch } first second
  first=$(cd / && sbatch --parsable "${script//\'/}")
  wait_job_done "$first" 120
  assert_job_state "$first" COMPLETED
  run job_log "$first"
  assert_line 'args: --fresh --lr 1'
  second=$(cd / && sbatch --parsable "${script//\'/}")
  wait_job_done "$second" 120
  assert_job_state "$second" COMPLETED
  run job_log "$second"
  assert_line 'args: --lr 1'
  assert_line "hpc: without --fresh: job $first ran trial 0 of this submission first, started afresh; this run resumes"
}
