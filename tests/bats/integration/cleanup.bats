#!/usr/bin/env bats
# plai_cleanups/submit_plai_cleanup on the real local cluster: one cleanup job
# per node removes the leftover local folders of a finished job and keeps the
# folder of a job that is running.

load '../test_helper'

SUBMIT_CLEANUP="$REPO_ROOT/plai_cleanups/submit_plai_cleanup"

setup() {
  require_cluster
  make_scratch
  user=${USER:-$(id -un)}
  base="$BATS_TEST_TMPDIR/ssd"
  me="$base/$user"
  sleeper=""
}

teardown() {
  [[ -z "$sleeper" ]] || scancel "$sleeper" 2>/dev/null || true
}

# start_sleeper: a job that stays RUNNING while the cleanup runs.
start_sleeper() {
  sleeper=$(sbatch --parsable -p notmpdir -o /dev/null --job-name=cleanup_sleeper --wrap 'sleep 120')
  sleeper=${sleeper%%;*}
  wait_job_state "$sleeper" 60 RUNNING
}

# plant: leftovers of finished jobs (plain and array task) on both nodes,
# and the running sleeper's folder on node1.
plant() {
  mkdir -p "$me/999999/node1/data" "$me/999999/node2/data" "$me/999998_3/node2" "$me/$sleeper/node1/data"
  echo old >"$me/999999/node1/data/f.txt"
  echo old >"$me/999999/node2/data/f.txt"
  echo live >"$me/$sleeper/node1/data/f.txt"
}

# cleanup_jobs: the job ids submit_plai_cleanup reported, one per line.
cleanup_jobs() {
  sed -n 's/^submit_plai_cleanup: submitted job \([0-9]*\) on .*/\1/p' <<<"$output"
}

@test "one cleanup job per node removes a finished job's folders and keeps a running job's" {
  local jobs job
  start_sleeper
  plant
  run timeout 300 "$SUBMIT_CLEANUP" --base "$base" -p notmpdir --wait
  assert_success
  jobs=$(cleanup_jobs)
  assert_equal "$(wc -l <<<"$jobs")" 2
  for job in $jobs; do
    assert_job_state "$job" COMPLETED
    assert_equal "$(job_field "$job" JobName)" plai_cleanup
  done
  assert_equal "$(for job in $jobs; do job_field "$job" NodeList; done | sort | tr '\n' ' ')" "node1 node2 "
  # The logs (in $SCRATCH/plai_cleanup_logs, printed by --wait) say why.
  assert_line "node1: removed $me/999999/node1 (job 999999 is not in squeue)"
  assert_line "node2: removed $me/999999/node2 (job 999999 is not in squeue)"
  assert_line "node2: removed $me/999998_3/node2 (job 999998 is not in squeue)"
  assert_line "node1: kept $me/$sleeper (job $sleeper is in squeue)"
  assert_line "node2: kept $me/$sleeper (job $sleeper is in squeue)"
  assert_equal "$(ls "$SCRATCH/plai_cleanup_logs" | wc -l)" 2
  assert_not_exist "$me/999999"
  assert_not_exist "$me/999998_3"
  assert_file_exist "$me/$sleeper/node1/data/f.txt"
  assert_equal "$(job_field "$sleeper" JobState)" RUNNING
  scancel "$sleeper"
  wait_job_done "$sleeper" 60
  sleeper=""
}

@test "--dry-run: the node jobs list what would go and remove nothing" {
  local before jobs
  start_sleeper
  plant
  before=$(find "$base" | sort)
  run timeout 300 "$SUBMIT_CLEANUP" --base "$base" -p notmpdir --dry-run --wait
  assert_success
  jobs=$(cleanup_jobs)
  assert_equal "$(wc -l <<<"$jobs")" 2
  assert_equal "$(find "$base" | sort)" "$before"
  assert_line "node1: would remove $me/999999/node1 (job 999999 is not in squeue)"
  assert_line "node2: would remove $me/999999/node2 (job 999999 is not in squeue)"
  assert_line "node1: kept $me/$sleeper (job $sleeper is in squeue)"
  refute_line --partial ": removed "
}
