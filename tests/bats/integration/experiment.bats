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

@test "--retry-failed reruns exactly the failed trials, in their own folders, from the same submission" {
  # Trials 1 and 3 fail until their file exists; 0 and 2 succeed.
  local flags="$BATS_TEST_TMPDIR/flags" k
  mkdir -p "$flags"
  for k in 0 1 2 3; do
    if ((k % 2)); then
      printf 'bash -c %q\n' "echo trial $k run; test -e '$flags/$k' || exit 3" 
    else
      printf 'bash -c %q\n' "echo trial $k run"
    fi
  done >"$BATS_TEST_TMPDIR/configs.txt"
  submit -n 1 -g 0 -c 1 -W none -t 5 -e retry -C "$BATS_TEST_TMPDIR/configs.txt"
  local first=$job_id sub
  sub=$(ls -d "$SCRATCH/$project/retry"/20*)
  for k in 0 1 2 3; do
    wait_job_done "${first}_$k" 120
  done
  assert_job_state "${first}_1" FAILED
  assert_job_state "${first}_2" COMPLETED
  touch "$flags/1" "$flags/3"
  run --separate-stderr "$SUBMITTER" --retry-failed retry
  assert_success
  assert_output --regexp "^Resubmitted trial\(s\) 1,3 of $sub as job [0-9]+ "
  local retry=${output#*as job }
  retry=${retry%% *}
  wait_job_done "${retry}_1" 120
  wait_job_done "${retry}_3" 120
  assert_job_state "${retry}_1" COMPLETED
  assert_job_state "${retry}_3" COMPLETED
  # Exactly tasks 1 and 3 ran again: the retry array holds no other task.
  run bash -c "scontrol show job -o '$retry' | grep -o 'ArrayTaskId=[0-9]*' | sort"
  assert_output "ArrayTaskId=1
ArrayTaskId=3"
  assert_equal "$(ls "$sub/runs" | grep -c "^${retry}_")" 2
  # Each trial's log: trials 1 and 3 ran twice, 0 and 2 once; status.sh shows every task
  # COMPLETED, the retried ones as the retry job's.
  assert_equal "$(cat "$SCRATCH/$project/hpc_outputs/"*_retry_*_1.out | grep -c '^trial 1 run$')" 2
  assert_equal "$(cat "$SCRATCH/$project/hpc_outputs/"*_retry_*_0.out | grep -c '^trial 0 run$')" 1
  run "$REPO_ROOT/hpc_files/status.sh" retry
  assert_success
  assert_equal "$(grep -cE "^[0-3] +COMPLETED" <<<"$output")" 4
  # Nothing failed now: a second retry queues nothing.
  run --separate-stderr "$SUBMITTER" --retry-failed retry
  assert_success
  [[ "$stderr" == *"no failed trial"* ]] || fail "stderr: $stderr"
}

# small_max_array: the cluster's MaxArraySize into max_array. Above 30 (the
# default cluster: 1001), the submitter alone is told 11 by an scontrol in
# front of the real one, so that the split runs a few dozen tasks; start
# the cluster with HPC_CLUSTER_MAX_ARRAY_SIZE=11 to have SLURM hold the limit.
small_max_array() {
  max_array=$(scontrol show config | sed -n 's/^MaxArraySize *= *//p')
  ((max_array <= 30)) && return 0
  max_array=11
  local bin="$BATS_TEST_TMPDIR/max-array-bin" real
  real=$(command -v scontrol)
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\nif [[ "$*" == "show config" ]]; then %q show config | sed "s/^MaxArraySize .*/MaxArraySize            = 11/"; else exec %q "$@"; fi\n' \
    "$real" "$real" >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  SUBMITTER_PATH="$bin:$PATH"
}

@test "a sweep above MaxArraySize runs as several arrays: each trial its own line and folder; one experiment to status.sh, results.sh and stop.sh" {
  local SUBMITTER_PATH=$PATH max_array n out arrays k
  small_max_array
  n=$((2 * max_array + 3))
  # Each trial writes its index (the folder's) as metric 'trial', and says which line it ran.
  out=$(PATH=$SUBMITTER_PATH "$SUBMITTER" --site local -n 1 -g 0 -c 1 -W none -t 5 -e split --seeds "$n" -- \
    bash -c 'echo "ran $HPC_TRIAL_INDEX $1"; printf "time,step,epoch,name,value\n1,1,0,trial,%s\n" "$HPC_TRIAL_INDEX" >"$HPC_TRIAL_DIR/metrics.csv"' prog 2>&1) ||
    fail "submission failed: $out"
  local sub
  sub=$(ls -d "$SCRATCH/$project/split"/20*)
  mapfile -t arrays < <(awk '{ print $1 }' "$sub/array_jobs")
  assert_equal "${#arrays[@]}" 3
  assert_equal "$(cut -d' ' -f2 "$sub/array_jobs" | paste -sd' ')" "0 $max_array $((2 * max_array))"
  assert_equal "$(grep -c "^  arrays: " <<<"$out")" 1
  # Every task of each array (wait_job_done on an array id sees its first
  # record alone, and returns while later tasks still run).
  for k in 0 1 2; do
    wait_array_done "${arrays[$k]}" $((k < 2 ? max_array : n - 2 * max_array)) 300
  done
  # Trial K ran line K (--seed=K) in trials/K, whichever array ran it.
  for ((k = 0; k < n; k++)); do
    assert_file_contains "$SCRATCH/$project/split/trials/$k/metrics.csv" "^1,1,0,trial,$k\$"
  done
  run grep -h '^ran ' "$SCRATCH/$project/hpc_outputs/"*_split_*.out
  assert_equal "$(sort <<<"$output" | uniq | wc -l)" "$n"
  assert_equal "$(grep -c '^ran \([0-9]*\) --seed=\1$' <<<"$output")" "$n"
  run "$REPO_ROOT/hpc_files/status.sh" split
  assert_success
  assert_line --index 1 --partial "job ${arrays[0]} and ${arrays[1]}, ${arrays[2]} (arrays), $n task(s)"
  assert_equal "$(grep -cE '^[0-9]+ +COMPLETED' <<<"$output")" "$n"
  run "$REPO_ROOT/hpc_files/results.sh" split --no-group --sort trial:min
  assert_success
  assert_line --index 1 "$n trial(s); sorted by trial (min)"
  # A task SLURM requeued after a failed launch (a loaded machine) still finished.
  for ((k = 0; k < n; k++)); do
    assert_line --index $((k + 3)) --regexp "^$k +$k +finished(, requeued [0-9]+x)? +$k +$k\$"
  done
  # stop.sh cancels every array of a split sweep.
  out=$(PATH=$SUBMITTER_PATH "$SUBMITTER" --site local -n 1 -g 0 -c 1 -W none -t 5 -e split2 --seeds "$n" -- sleep 300 2>&1) ||
    fail "submission failed: $out"
  sub=$(ls -d "$SCRATCH/$project/split2"/20*)
  mapfile -t arrays < <(awk '{ print $1 }' "$sub/array_jobs")
  run "$REPO_ROOT/hpc_files/stop.sh" split2
  assert_success
  assert_output --partial "cancelled job(s) $(printf '%s\n' "${arrays[@]}" | sort -n | paste -sd,)"
  for k in "${arrays[@]}"; do
    wait_job_done "$k" 60
  done
}
