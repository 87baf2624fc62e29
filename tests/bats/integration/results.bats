#!/usr/bin/env bats
# status.sh and results.sh on the real local cluster: a 2x2 grid x 2 seeds of
# the example trainer with one configuration failing, read back as 4 rows
# (mean ± std over the seeds, the failure named with its exit code) plus CSV
# and PNG; and status.sh following a 2-node job through a wall-time requeue.

load '../test_helper'

STATUS="$REPO_ROOT/hpc_files/status.sh"
RESULTS="$REPO_ROOT/hpc_files/results.sh"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  data=$(digits_dataset)
}

@test "a 2x2 grid x 2 seeds: results.sh shows 4 configurations (mean ± std over 2 seeds), the failed one with its exit code, sorted by test accuracy; --csv and --plot write files" {
  # The trials take the example's default data folder, \$scratch_dir/datasets/digits.
  mkdir -p "$SCRATCH/$project/datasets"
  cp -r "$data" "$SCRATCH/$project/datasets/digits"
  submit -n 1 -g 0 -c 1 -W none -t 10 -e grid --sweep "$REPO_ROOT/tests/bats/fixtures/sweeps/results_grid.yml" --seeds 2
  local grid=$job_id
  wait_array_done "$grid" 8 400
  run --separate-stderr "$RESULTS" grid --metrics test_acc,test_loss --csv "$BATS_TEST_TMPDIR/r.csv" --plot "$BATS_TEST_TMPDIR/r.png"
  printf "%s\n" "$output" >"$BATS_TEST_TMPDIR/results.txt"
  assert_success
  assert_line --index 1 '8 trial(s); sorted by test_acc (max)'
  assert_line --index 2 --regexp '^trials +epochs +fail-at-step +n +state +test_acc +best test_acc +test_loss +best test_loss$'
  # 4 configurations, each row the two seeds of one.
  assert_equal "$(grep -cE '^[0-9]+,[0-9]+ ' <<<"$output")" 4
  # epochs 2 / fail-at-step 60 (trials 4 and 5) failed with the program's exit code.
  assert_line --regexp '^4,5 +2 +60 +2 +failed \(exit 1\) '
  # The 3 finished ones: mean ± std over 2 seeds, best first; the configuration
  # whose every trial failed comes last, whatever its partial accuracy.
  assert_equal "$(grep -cE '^[0-9],[0-9] +[12] +[0-9]+ +2 +finished +0\.[0-9]+ ± [0-9.e-]+ ' <<<"$output")" 3
  assert_line --index 6 --regexp '^4,5 '
  local accs sorted
  accs=$(sed -n '4,6p' <<<"$output" | awk '{print $6}')
  sorted=$(sort -gr <<<"$accs")
  assert_equal "$accs" "$sorted"
  assert_line --index 3 --regexp '^(2,3 +1 +100000|6,7 +2 +100000) '
  assert_line "wrote $BATS_TEST_TMPDIR/r.csv"
  assert_line "wrote $BATS_TEST_TMPDIR/r.png"
  assert_equal "$(wc -l <"$BATS_TEST_TMPDIR/r.csv")" 5
  run od -An -c -N 4 "$BATS_TEST_TMPDIR/r.png"
  assert_output --regexp '211 +P +N +G'
  (($(stat -c %s "$BATS_TEST_TMPDIR/r.png") > 5000)) || fail "PNG too small"
  # One row per trial: 8, both failed seeds named.
  run "$RESULTS" grid --no-group -m test_acc
  assert_success
  assert_equal "$(grep -cE '^[0-7] ' <<<"$output")" 8
  assert_equal "$(grep -c 'failed (exit 1)' <<<"$output")" 2
  # status.sh: every task ended; the two failed ones with their code.
  run "$STATUS" grid
  assert_success
  assert_equal "$(grep -cE '^[0-7] +COMPLETED ' <<<"$output")" 6
  assert_equal "$(grep -cE '^[45] +FAILED \(exit 1\) ' <<<"$output")" 2
  # Task 4 run again alone, by hand: that job becomes the folder's job_id, and
  # the other tasks stay the first job's (they are not 'not started').
  local again sub
  sub=$(dirname "$(grep -l "^$grid\$" "$SCRATCH/$project/grid"/*/job_id)")
  again=$(sbatch --parsable --array=4 "$sub/job.sbatch")
  again=${again%%;*}
  wait_array_done "$again" 1 200
  run "$STATUS" grid
  assert_success
  assert_line --index 1 "job $again (tasks it did not run: job $grid), 8 task(s); states from SLURM"
  assert_equal "$(grep -cE '^[0-7] +COMPLETED ' <<<"$output")" 6
  assert_equal "$(grep -cE '^[45] +FAILED \(exit 1\) ' <<<"$output")" 2
  run "$RESULTS" grid --no-group -m test_acc
  assert_equal "$(grep -c 'not started' <<<"$output")" 0
  run "$STATUS" "$grid"
  assert_success
  assert_line --index 0 --partial "$sub"
}

@test "status.sh follows a 2-node job: RUNNING with a progress line; after a wall-time requeue, 1 restart (from SLURM, and from the log alone)" {
  local args=(--epochs 3 --checkpoint-every 10 --signal-check-every 1 --step-sleep 0.05 --data-dir "$data")
  submit -n 2 -g 1 -c 1 -W torchrun -t 10 -e live -- python -m hpc_harness.train "${args[@]}"
  local live=$job_id
  wait_log "$live" '^hpc_harness: step (1[5-9]|[2-9][0-9])/' 180
  run "$STATUS" live
  assert_success
  printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/status_running.txt"
  assert_line --index 1 "job $live, 1 task(s); states from SLURM"
  assert_line --index 3 --regexp '^0 +RUNNING +0 +[0-9:]+ +[^ ]+ +step [0-9]+/[0-9]+ epoch [0-9]+ loss [0-9.]+$'
  scancel --signal=USR1 --batch "$live"
  release_requeued "$live" 1
  wait_job_done "$live" 240
  assert_job_state "$live" COMPLETED
  run "$STATUS" "$live"
  assert_success
  printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/status_done.txt"
  assert_line --index 3 --regexp '^0 +COMPLETED +1 +[0-9:]+ +[^ ]+ +step [0-9]+/[0-9]+ '
  # Once the controller has forgotten the job (MinJobAge), accounting tells
  # the same where the cluster keeps it (the production shape)...
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n' >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  if sacct -n -X -j "$live" 2>/dev/null | grep -q .; then
    PATH="$bin:$PATH" run "$STATUS" live
    assert_success
    assert_line --index 1 "job $live, 1 task(s); states from sacct"
    # Peak memory too: only accounting keeps it.
    assert_line --index 3 --regexp '^0 +COMPLETED +1 +[0-9:]+ +[0-9.]+[KMG] +step [0-9]+/[0-9]+ '
  fi
  # ... and without accounting, the log alone.
  printf '#!/usr/bin/env bash\necho "sacct: error: Slurm accounting storage is disabled" >&2\nexit 1\n' >"$bin/sacct"
  chmod +x "$bin/sacct"
  PATH="$bin:$PATH" run "$STATUS" live
  assert_success
  assert_line --index 1 "job $live, 1 task(s); states from logs"
  assert_line --index 3 --regexp '^0 +finished +1 +[0-9:]+ +- +step [0-9]+/[0-9]+ '
}

@test "results.sh of an earlier job shows its own result after a later submission's --fresh took the folder over" {
  mkdir -p "$SCRATCH/$project/datasets"
  cp -r "$data" "$SCRATCH/$project/datasets/digits"
  submit -n 1 -g 0 -c 1 -W none -t 5 -e fresh -- python -m hpc_harness.train --epochs 1 --lr 0.1
  local first=$job_id
  wait_job_done "$first" 180
  assert_job_state "$first" COMPLETED
  run "$RESULTS" "$first" --metrics test_acc
  assert_success
  local own
  own=$(awk '$1 == "0" {print $NF}' <<<"$output")
  [[ "$own" =~ ^0\.[0-9]+$ ]] || fail "no test_acc for job $first: $output"
  # The later run moves the folder aside (checkpoints.old-*) and writes its own metrics.csv.
  submit -n 1 -g 0 -c 1 -W none -t 5 -e fresh -- python -m hpc_harness.train --epochs 1 --lr 0.003 --fresh
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" COMPLETED
  run "$RESULTS" "$job_id" --metrics test_acc
  local later
  later=$(awk '$1 == "0" {print $NF}' <<<"$output")
  [[ "$later" =~ ^0\.[0-9]+$ && "$later" != "$own" ]] || fail "job $job_id's test_acc '$later' vs '$own': $output"
  run "$RESULTS" "$first" --metrics test_acc
  assert_success
  assert_equal "$(awk '$1 == "0" {print $NF}' <<<"$output")" "$own"
}
