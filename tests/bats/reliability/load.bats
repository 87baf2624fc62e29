#!/usr/bin/env bats
# Load on the real local cluster. Each test name reads "<what is injected>:
# <what must hold>"; durations go to RELIABILITY.md.

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
}

# wait_array_ended JOB SECONDS: every task of the array has ended.
wait_array_ended() {
  local job=$1 deadline=$((SECONDS + $2)) left
  while :; do
    left=$(squeue -h -j "$job" -r 2>/dev/null | wc -l)
    ((left == 0)) && return 0
    ((SECONDS < deadline)) || fail "array $job still has $left task(s) queued or running after $2 s"
    sleep 1
  done
}

@test "1500 trials against MaxArraySize 1001 with a throttle of 50: two arrays, every task runs exactly once in its own folder; results.sh lists 1500 rows; the submitter stays responsive" {
  local max_array
  max_array=$(scontrol show config | sed -n 's/^MaxArraySize *= *//p')
  ((max_array == 1001)) || skip "the cluster's MaxArraySize is $max_array, not SLURM's default 1001"
  local configs="$BATS_TEST_TMPDIR/configs.txt" start out
  # Each trial appends its task id to a file in its folder and writes its
  # index as metric 'trial'.
  # shellcheck disable=SC2016 # expanded by the trial's bash
  printf '%s\n' 'bash -c '"'"'echo "$SLURM_ARRAY_TASK_ID" >>"$HPC_TRIAL_DIR/ran"; printf "time,step,epoch,name,value\n1,1,0,trial,%s\n" "$HPC_TRIAL_INDEX" >"$HPC_TRIAL_DIR/metrics.csv"'"'" >"$configs"
  start=$SECONDS
  out=$("$SUBMITTER" --site local -W none -g 0 -c 1 -t 5 -e load1500 -C "$configs" --seeds 1500 --array-throttle 50 2>&1) ||
    fail "submission failed: $out"
  local submit_seconds=$((SECONDS - start))
  # Bounds far above a quiet machine's (about 2 s and 1 s): a stuck submitter, not a slow one.
  ((submit_seconds <= 60)) || fail "submitting 1500 trials took $submit_seconds s"
  # While the arrays run, the submitter answers a dry run promptly.
  start=$SECONDS
  "$SUBMITTER" --site local -W none -g 0 -e probe --dry-run -- true >/dev/null
  ((SECONDS - start <= 30)) || fail "a dry run under load took $((SECONDS - start)) s"
  local sub arrays k
  sub=$(ls -d "$SCRATCH/$project/load1500"/20*)
  mapfile -t arrays < <(awk '{ print $1 }' "$sub/array_jobs")
  assert_equal "$(cut -d' ' -f2 "$sub/array_jobs" | paste -sd' ')" "0 1001"
  for k in "${arrays[@]}"; do
    wait_array_ended "$k" 1500
  done
  local dirs
  dirs=$(find "$SCRATCH/$project/load1500/trials" -mindepth 1 -maxdepth 1 -type d | wc -l)
  assert_equal "$dirs" 1500
  # Each folder holds exactly one line: its own task id, counted from its array's first trial.
  run bash -c 'for d in "$1"/*; do i=${d##*/}; printf "%s %s\n" "$((i < 1001 ? i : i - 1001))" "$(tr "\n" " " <"$d/ran")"; done | awk "\$1 != \$2 || NF != 2" | head' _ "$SCRATCH/$project/load1500/trials"
  assert_output ''
  local failed
  failed=$(for k in "${arrays[@]}"; do scontrol show job -o "$k"; done | grep -vc 'JobState=COMPLETED' || true)
  assert_equal "$failed" 0
  run "$REPO_ROOT/hpc_files/results.sh" load1500 --no-group --sort trial:min
  assert_success
  assert_line --index 1 "1500 trial(s); sorted by trial (min)"
  assert_equal "$(grep -cE '^[0-9]+ +[0-9]+ +finished' <<<"$output")" 1500
  echo "# 1500 tasks in 2 arrays: submitted in ${submit_seconds} s" >&3
}

@test "20 concurrent job_submitter.sh runs with the same data: one tarball is built, all 20 jobs run and read complete data" {
  local dir="$SCRATCH/$project/datasets/many" i
  mkdir -p "$dir"
  for i in $(seq 1 2000); do
    printf 'file %s\n' "$i" >"$dir/f$i.txt"
  done
  local pids=()
  for i in $(seq 1 20); do
    "$SUBMITTER" --site local -W none -g 0 -c 1 -t 5 -e "conc$i" -d datasets/many -- \
      bash -c 'ls "$SLURM_TMPDIR/datasets/many" | wc -l' >"$BATS_TEST_TMPDIR/out$i" 2>"$BATS_TEST_TMPDIR/err$i" &
    pids+=($!)
  done
  local failures=0
  for i in "${pids[@]}"; do
    wait "$i" || failures=$((failures + 1))
  done
  assert_equal "$failures" 0
  assert_equal "$(cat "$BATS_TEST_TMPDIR"/err* | grep -c 'data: building')" 1
  assert_equal "$(cat "$BATS_TEST_TMPDIR"/err* | grep -c 'data: reusing')" 19
  run find "$SCRATCH/$project/.hpc_data_cache" -name 'data-*.tar'
  assert_equal "${#lines[@]}" 1
  run find "$SCRATCH/$project/.hpc_data_cache" -name '*.tmp*'
  assert_output ''
  local job
  for i in $(seq 1 20); do
    job=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' "$BATS_TEST_TMPDIR/out$i")
    wait_job_done "$job" 300
    assert_job_state "$job" COMPLETED
    assert_file_contains "$SCRATCH/$project/hpc_outputs/${project}_conc${i}_$job.out" '^2000$'
  done
}
