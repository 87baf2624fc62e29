#!/usr/bin/env bats
# What runs inside the allocation, on the real local cluster: data staged once
# per node (with and without a site SLURM_TMPDIR), the tarball cache, failures
# before training, the mimic folder's removal, and requeue at the wall time.

load '../test_helper'

PROGRAMS="$REPO_ROOT/tests/bats/fixtures/programs"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  export HPC_DEMO_BASE="$BATS_TEST_TMPDIR/local-ssd"
  mkdir -p "$SCRATCH/$project/datasets/d1" "$SCRATCH/$project/datasets/d2"
  echo one >"$SCRATCH/$project/datasets/d1/a.txt"
  echo two >"$SCRATCH/$project/datasets/d2/b.txt"
  # A site profile whose mimic base is private to this test.
  site="$BATS_TEST_TMPDIR/site.conf"
  sed "s|^tmpdir_base = .*|tmpdir_base = $HPC_DEMO_BASE|" "$REPO_ROOT/hpc_files/sites/local.conf" >"$site"
  TEST_SITE=$site
}



@test "two data paths are staged once per node, into per-node folders, on both partitions" {
  local partition
  for partition in tmpdir notmpdir; do
    submit -p "$partition" -n 2 -g 2 -c 1 -W lightning -t 5 --signal-lead 60 -e stage -d datasets/d1 datasets/d2 -- \
      bash -c '"$1" "$SLURM_TMPDIR/datasets/d1/a.txt" "$SLURM_TMPDIR/datasets/d2/b.txt"' _ "$PROGRAMS/probe.sh"
    wait_job_done "$job_id" 90
    assert_job_state "$job_id" COMPLETED
    run job_log "$job_id"
    # Extracted once per node (2 nodes), not once per task (4 tasks).
    assert_equal "$(grep -c 'staged data-.* into ' <<<"$output")" 2
    assert_output --regexp "node1: staged data-[0-9a-f]{16}-[0-9a-f]{16}\.tar into "
    assert_output --regexp "node2: staged data-[0-9a-f]{16}-[0-9a-f]{16}\.tar into "
    assert_equal "$(grep -c 'probe read .*/datasets/d1/a.txt: one' <<<"$output")" 4
    assert_equal "$(grep -c 'probe read .*/datasets/d2/b.txt: two' <<<"$output")" 4
    # Every task on a node saw the same folder; the two nodes saw different ones.
    assert_equal "$(grep '^probe rank' <<<"$output" | sed 's/.* tmpdir=\([^ ]*\) .*/\1/' | sort -u | wc -l)" 2
    if [[ "$partition" == notmpdir ]]; then
      assert_output --regexp "tmpdir=$HPC_DEMO_BASE/[^/]+/$job_id/node1 "
    else
      assert_output --regexp "tmpdir=.*/node1/job$job_id "
    fi
  done
}

@test "the data tarball is reused while unchanged; a changed file builds another, and a job queued before stages the data it was submitted with" {
  submit -n 1 -g 1 -W none -t 5 --signal-lead 60 -e cache -d datasets/d1 -- true
  assert_file_contains "$submit_err" "data: building data-"
  # Other experiments (one is refused while another job of it is queued): the cache is the project's.
  submit -n 1 -g 1 -W none -t 5 --signal-lead 60 -e cache-held -d datasets/d1 --sbatch-arg=--hold -- \
    bash -c 'echo "read: $(cat "$SLURM_TMPDIR/datasets/d1/a.txt")"'
  assert_file_contains "$submit_err" "data: reusing data-"
  local queued=$job_id
  echo changed >"$SCRATCH/$project/datasets/d1/a.txt"
  touch -d '+1 minute' "$SCRATCH/$project/datasets/d1/a.txt"
  submit -n 1 -g 1 -W none -t 5 --signal-lead 60 -e cache-changed -d datasets/d1 -- \
    bash -c 'echo "read: $(cat "$SLURM_TMPDIR/datasets/d1/a.txt")"'
  assert_file_contains "$submit_err" "data: building data-"
  assert_file_contains "$submit_err" "1 earlier tarball(s) of these paths"
  wait_job_done "$job_id" 60
  run job_log "$job_id"
  assert_line "read: changed"
  # The job held since before the change runs now, with the data of its submission.
  scontrol release "$queued"
  wait_job_done "$queued" 60
  assert_job_state "$queued" COMPLETED
  run job_log "$queued"
  assert_line "read: one"
}

@test "a tarball truncated after submission fails the job on the node, before training starts" {
  submit -p notmpdir -n 2 -g 1 -W lightning -t 5 --signal-lead 60 -e trunc -d datasets/d1 \
    --sbatch-arg=--hold -- bash -c 'echo TRAINING-STARTED'
  local tarball
  tarball=$(ls "$SCRATCH/$project/.hpc_data_cache/"data-*.tar)
  truncate -s 512 "$tarball"
  scontrol release "$job_id"
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --regexp "staging failed on node[12]\.failed: .*truncated or replaced"
  refute_output --partial TRAINING-STARTED
  # The mimic folders were removed even though the job failed.
  run find "$HPC_DEMO_BASE" -mindepth 3 -name 'node*'
  assert_output ''
}

# At a cancel, timeout or preemption SLURM sends TERM to the keepers, and to
# their srun in the batch step, which answers by SIGKILLing them (SLURM 22.05
# here): which comes first is a race, so the keepers' own TERM is sent to
# their step alone, and plai_cleanups/ (its own test) removes what a SIGKILL
# leaves.
@test "the mimic SLURM_TMPDIR is removed when the job ends, and by the keepers at the TERM a cancel sends them" {
  submit -p notmpdir -n 2 -g 1 -W lightning -t 5 --signal-lead 60 -e mimic -- bash -c 'touch "$SLURM_TMPDIR/result"; ls "$SLURM_TMPDIR"'
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  run find "$HPC_DEMO_BASE" -mindepth 3 -name 'node*'
  assert_output ''

  submit -p notmpdir -n 2 -g 1 -W lightning -t 5 --signal-lead 60 -e mimic -- bash -c 'echo READY; sleep 120'
  wait_job_state "$job_id" 60 RUNNING
  wait_log "$job_id" READY 30
  run find "$HPC_DEMO_BASE" -mindepth 3 -maxdepth 3 -name 'node*'
  assert_equal "${#lines[@]}" 2
  local keeper_step
  keeper_step=$(squeue -h -s -j "$job_id" -o '%i|%j' | awk -F'|' '$2 == "hpc-keeper" { print $1 }')
  [[ "$keeper_step" == "$job_id".* ]] || fail "no hpc-keeper step in: $(squeue -s -j "$job_id")"
  scancel --signal=TERM "$keeper_step"
  # At a TERM the keepers wait for the program up to the grace time (the
  # partition's GraceTime, 30 s here) less a margin, then clean up.
  local deadline=$((SECONDS + 60))
  while [[ -n "$(find "$HPC_DEMO_BASE" -mindepth 3 -maxdepth 3 -name 'node*')" ]]; do
    ((SECONDS < deadline)) || fail "mimic folders still there 60 s after TERM: $(find "$HPC_DEMO_BASE")"
    sleep 0.2
  done
  scancel "$job_id"
  wait_job_done "$job_id" 60
  run job_log "$job_id"
  assert_output --regexp "node1: removed .*/node1"
  assert_output --regexp "node2: removed .*/node2"
}


# 90 s with a 30 s lead: slurmctld's 30 s checks send USR1 30-60 s after the
# start, never at a check before the batch step runs (where it would be lost).
@test "wall time: --time 1:30 with a 30 s lead sends USR1, the job requeues once and resumes with SLURM_RESTART_COUNT=1" {
  submit -p notmpdir -n 1 -g 1 -W none -t 00:01:30 --signal-lead 30 -e walltime -- "$PROGRAMS/requeue_probe.sh"
  release_requeued "$job_id" 1 150
  wait_job_done "$job_id" 90
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial 'received SIGUSR1'
  assert_output --partial 'requeue_probe: got SIGUSR1; checkpointing'
  assert_output --regexp "requeued $job_id \(restart 1 of at most 10\)"
  assert_output --partial 'requeue_probe: run restart=0'
  assert_output --partial 'requeue_probe: run restart=1'
  assert_output --partial 'requeue_probe: resumed after 1 requeue(s)'
  # Both runs are in one log, and no mimic folder is left behind.
  assert_equal "$(grep -c '^hpc: job .* started' <<<"$output")" 2
  run find "$HPC_DEMO_BASE" -mindepth 3 -name 'node*'
  assert_output ''
}

@test "--no-signal: a 1-minute job gets no USR1, though it runs 40 s, past the time a 30 s lead would have sent one; the program runs on to its end" {
  submit -p notmpdir -n 1 -g 1 -W none -t 00:01:00 --no-signal -e nosignal -- \
    bash -c 'trap "echo got USR1; exit 42" USR1; for i in $(seq 40); do sleep 1; done; echo ran 40 s'
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_line 'ran 40 s'
  refute_output --partial 'USR1'
  assert_equal "$(grep -c '^hpc: job .* started' <<<"$output")" 1
}

@test "--max-requeues bounds the requeues: one more signal ends the job with a clear message" {
  submit -p tmpdir -n 1 -g 1 -W none -t 5 --signal-lead 60 --max-requeues 1 -e maxrq -- \
    env REQUEUE_PROBE_ALWAYS=1 "$PROGRAMS/requeue_probe.sh"
  local run_no
  for run_no in 0 1; do
    local deadline=$((SECONDS + 60))
    until job_log "$job_id" 2>/dev/null | grep -q "requeue_probe: run restart=$run_no"; do
      ((SECONDS < deadline)) || fail "run $run_no did not start within 60 s"
      sleep 0.2
    done
    # The wall-time signal, delivered as SLURM does: USR1 to the batch shell.
    scancel --signal=USR1 --batch "$job_id"
    ((run_no == 1)) || release_requeued "$job_id" 1
  done
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --partial 'already requeued 1 time(s) (--max-requeues 1); not requeueing'
}

@test "preempted (PreemptMode=REQUEUE), a program that dies of the TERM without a checkpoint marker is requeued, not ended FAILED" {
  # SLURM signals the steps, not the batch script: the step ended (exit 1)
  # before the grace time, and the job ended FAILED, never to run again.
  submit -p notmpdir -n 2 -g 4 -c 2 -W lightning -t 10 -e preempt -- \
    python -c 'import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(1)); print("READY", flush=True); time.sleep(600)'
  # All 8 tasks, not the first: a task still starting Python when the TERM
  # comes dies of it (143) before its handler exists.
  wait_log "$job_id" '^READY$' 120 8
  local urgent
  urgent=$(sbatch --parsable -p urgent -N 2 --ntasks-per-node=1 -c 8 -o /dev/null --wrap 'sleep 1')
  release_requeued "$job_id" 1 120
  run job_log "$job_id"
  assert_output --partial "preempted: the training step ended with exit code 1 without a checkpoint marker; requeueing"
  wait_log "$job_id" 'restart 1, started' 120
  wait_job_done "$urgent" 60
}
