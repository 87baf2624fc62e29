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

# wait_all_done JOB SECONDS: every task of the array has ended.
wait_array_ended() {
  local job=$1 deadline=$((SECONDS + $2)) left
  while :; do
    left=$(squeue -h -j "$job" -r 2>/dev/null | wc -l)
    ((left == 0)) && return 0
    ((SECONDS < deadline)) || fail "array $job still has $left task(s) queued or running after $2 s"
    sleep 1
  done
}

@test "a 1000-task array with a throttle of 50: every task runs exactly once, in its own folder; the submitter stays responsive" {
  local configs="$BATS_TEST_TMPDIR/configs.txt" start out job_id
  printf '%s\n' 'bash -c '"'"'echo "$SLURM_ARRAY_TASK_ID" >>"$HPC_TRIAL_DIR/ran"'"'" >"$configs"
  start=$SECONDS
  out=$("$SUBMITTER" --site local -W none -g 0 -c 1 -t 5 -e load1000 -C "$configs" --seeds 1000 --array-throttle 50 2>&1)
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  [[ -n "$job_id" ]] || fail "no job id: $out"
  local submit_seconds=$((SECONDS - start))
  ((submit_seconds <= 10)) || fail "submitting 1000 trials took $submit_seconds s"
  # While the array runs, the submitter answers a dry run promptly.
  start=$SECONDS
  "$SUBMITTER" --site local -W none -g 0 -e probe --dry-run -- true >/dev/null
  ((SECONDS - start <= 5)) || fail "a dry run under load took $((SECONDS - start)) s"
  wait_array_ended "$job_id" 1500
  local dirs
  dirs=$(find "$SCRATCH/$project/load1000/trials" -mindepth 1 -maxdepth 1 -type d | wc -l)
  assert_equal "$dirs" 1000
  # Each folder holds exactly one line: its own task id.
  run bash -c 'for d in "$1"/*; do printf "%s %s\n" "${d##*/}" "$(tr "\n" " " <"$d/ran")"; done | awk "\$1 != \$2 || NF != 2" | head' _ "$SCRATCH/$project/load1000/trials"
  assert_output ''
  local failed
  failed=$(scontrol show job -o "$job_id" | grep -vc 'JobState=COMPLETED' || true)
  assert_equal "$failed" 0
  echo "# 1000 tasks: submitted in ${submit_seconds} s" >&3
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
