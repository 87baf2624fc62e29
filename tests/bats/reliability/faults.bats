#!/usr/bin/env bats
# Faults injected for real on the local cluster. Each test name reads
# "<what is injected>: <what must hold>"; tools/reliability_report.sh turns
# them into RELIABILITY.md.

load '../test_helper'

teardown() {
  cancel_test_jobs
  # A test that killed a slurmd brings it back even when it failed.
  "${cluster[@]}" up >/dev/null 2>&1 || true
}

setup() {
  cluster_test_setup
  # The cluster in use (SLURM_CONF): .cluster, or the one make test starts for
  # this suite (.cluster-reliability), or .cluster-24.11 under SLURM_PREFIX.
  cluster_dir=${SLURM_CONF%/etc/slurm.conf}
  cluster=(env HPC_CLUSTER_DIR="$cluster_dir" "$REPO_ROOT/local_cluster/cluster.sh")
  data=$(digits_dataset)
  train=(python -m hpc_harness.train --data-dir "$data" --seed 3 --checkpoint-every 10 --signal-check-every 1)
}

@test "wall time twice, then once more than --max-requeues allows: two requeues, bitwise-equal final weights to an uninterrupted run, then a clear stop" {
  local args=("${train[@]}" --epochs 4 --step-sleep 0.05)
  submit -n 2 -g 1 -c 1 -W torchrun -t 10 -e straight -- "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/straight"
  local straight=$job_id
  submit -n 2 -g 1 -c 1 -W torchrun -t 10 --max-requeues 2 -e twice -- "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/twice"
  local twice=$job_id
  wait_log "$twice" '^hpc_harness: step (2[0-9]|[3-9][0-9])/' 180
  scancel --signal=USR1 --batch "$twice"
  release_requeued "$twice" 1
  wait_log "$twice" 'restart 1, started' 120
  wait_log "$twice" '^hpc_harness: step (6[0-9]|[7-9][0-9]|1[0-9][0-9])/' 180
  scancel --signal=USR1 --batch "$twice"
  release_requeued "$twice" 2
  wait_job_done "$straight" 300
  wait_job_done "$twice" 300
  assert_job_state "$straight" COMPLETED
  assert_job_state "$twice" COMPLETED
  assert_weights_equal "$BATS_TEST_TMPDIR/straight/last.pt" "$BATS_TEST_TMPDIR/twice/last.pt"
  run job_log "$twice"
  assert_equal "$(grep -c '^hpc: job .* started' <<<"$output")" 3

  # A third signal with --max-requeues 2 ends the job, it does not loop.
  submit -n 1 -g 1 -c 1 -W none -t 10 --max-requeues 0 -e stop -- "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/stop"
  wait_log "$job_id" '^hpc_harness: step [0-9]+/' 120
  scancel --signal=USR1 --batch "$job_id"
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --partial 'already requeued 0 time(s) (--max-requeues 0); not requeueing. Resubmit to continue from the checkpoint.'
}

@test "rank 0 killed with SIGKILL while it writes a checkpoint (mid-epoch): the job FAILS; the next run names the partial file, resumes from the previous complete checkpoint and ends bitwise equal to an uninterrupted run" {
  # About 23 steps per epoch at 2 x 1 processes: step 30 is mid-epoch 1.
  local args=("${train[@]}" --epochs 2) ck="$BATS_TEST_TMPDIR/crash" deadline tmp="" pid
  submit -n 2 -g 1 -c 1 -W torchrun -t 10 -e straight -- "${args[@]}" --ckpt-dir "$BATS_TEST_TMPDIR/straight"
  local straight=$job_id
  submit -n 2 -g 1 -c 1 -W torchrun -t 10 -e crash -- "${args[@]}" --ckpt-dir "$ck" --pause-in-save-at-step 30
  # The checkpoint of step 30 is held as a complete temp file before its
  # rename (a testing aid): kill the process writing it (its pid ends the name).
  deadline=$((SECONDS + 180))
  until tmp=$(compgen -G "$ck/.ckpt_step00000030.pt.tmp.*"); do
    ((SECONDS < deadline)) || fail "no temp file of the step-30 checkpoint in 180 s: $(job_log "$job_id" 2>&1 | tail -n 15)"
    sleep 0.2
  done
  pid=${tmp##*.}
  kill -9 "$pid"
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" FAILED
  assert_file_exists "$ck/ckpt_step00000020.pt"
  assert_file_not_exists "$ck/ckpt_step00000030.pt"
  assert_file_exists "$tmp"

  submit -n 2 -g 1 -c 1 -W torchrun -t 10 -e crash -- "${args[@]}" --ckpt-dir "$ck"
  wait_job_done "$job_id" 180
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial "ignoring incomplete checkpoint $tmp (a save was interrupted)"
  assert_output --partial "resumed from $ck/ckpt_step00000020.pt (global step 20"
  wait_job_done "$straight" 180
  assert_job_state "$straight" COMPLETED
  assert_weights_equal "$BATS_TEST_TMPDIR/straight/last.pt" "$ck/last.pt"
  # The save of step 30 that completed this time removed the dead temp file.
  assert_file_not_exists "$tmp"
}

@test "preemption by the urgent partition: SIGTERM, checkpoint within the grace time, requeue, resume from that checkpoint" {
  # Fill both nodes (8 CPUs each) so the urgent job must preempt.
  submit -p tmpdir -n 2 -g 4 -c 2 -W torchrun -t 10 -e preempted -- "${train[@]}" --epochs 30 --step-sleep 0.05 \
    --ckpt-dir "$BATS_TEST_TMPDIR/preempted"
  wait_log "$job_id" '^hpc_harness: step [0-9]+/' 180
  local urgent
  urgent=$(sbatch --parsable -p urgent -N 2 --ntasks-per-node=1 -c 8 -o /dev/null --wrap 'sleep 2')
  wait_job_done "$urgent" 120
  assert_job_state "$urgent" COMPLETED
  run job_log "$job_id"
  assert_output --regexp 'hpc_harness: SIGTERM received: checkpointed at global step [0-9]+'
  local step
  step=$(job_log "$job_id" | sed -n 's/.*SIGTERM received: checkpointed at global step \([0-9]*\).*/\1/p' | head -n 1)
  release_requeued "$job_id" 1
  wait_log "$job_id" 'restart 1, started' 120
  wait_log "$job_id" "resum.*step0*$step" 180
  scancel "$job_id"
}

@test "preemption of a job whose TERM handler reads and writes its SLURM_TMPDIR for 3 s: the read succeeds and the file is staged out" {
  submit -p notmpdir -n 1 -g 0 -c 1 -W none -t 10 -e graceful --stage-out out -- bash "$FIXTURES/programs/term_grace.sh"
  wait_log "$job_id" '^term_grace: started' 120
  local urgent
  urgent=$(sbatch --parsable -p urgent -N 2 --ntasks-per-node=1 -c 8 -o /dev/null --wrap 'sleep 2')
  wait_log "$job_id" 'staged out out' 120
  run job_log "$job_id"
  assert_output --partial 'term_grace: SIGTERM'
  assert_output --partial 'term_grace: read ok'
  assert_output --partial 'term_grace: wrote late.txt'
  assert_equal "$(cat "$SCRATCH/${REPO_ROOT##*/}/graceful/out/late.txt")" late
  wait_job_done "$urgent" 120
  scancel "$job_id"
}

@test "a slurmd killed during a 2-node job: node DOWN, job requeued; node back: the job resumes from its last checkpoint" {
  # Slow steps: the run must outlast the ~30 s SLURM takes to declare the node down.
  submit -p notmpdir -n 2 -g 1 -c 1 -W torchrun -t 10 -e nodefail -- "${train[@]}" --epochs 8 --step-sleep 0.3 \
    --ckpt-dir "$BATS_TEST_TMPDIR/nodefail"
  wait_log "$job_id" '^hpc_harness: step (2[0-9]|[3-9][0-9])/' 180
  local pid
  pid=$(<"$cluster_dir/run/slurmd-node2.pid")
  kill -KILL "$pid"
  local deadline=$((SECONDS + 120))
  until [[ "$(job_field "$job_id" Restarts)" == 1 && "$(job_field "$job_id" JobState)" == PENDING ]]; do
    ((SECONDS < deadline)) || fail "job $job_id was not requeued after the node failure: $(scontrol show job "$job_id" | head -n 5)"
    sleep 0.5
  done
  run sinfo -h -N -n node2 -o %T
  assert_output --regexp '^down'
  "${cluster[@]}" up >/dev/null
  # The returning slurmd revokes the old run's credential as it registers;
  # release only after that second, or the new launch is refused.
  local back=$(($(date +%s) + 2))
  until (($(date +%s) > back)); do sleep 0.2; done
  scontrol update JobId="$job_id" StartTime=now
  wait_job_done "$job_id" 300
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial 'DUE TO NODE FAILURE'
  assert_output --regexp 'resum.*ckpt_step'
  assert_output --partial 'restart 1, started'
  assert_file_exists "$BATS_TEST_TMPDIR/nodefail/last.pt"
  # Only our own slurmd was touched: every daemon runs again.
  run "${cluster[@]}" status
  assert_success
}

@test "a rank raises on one node: the step ends, the job is FAILED with the program's exit code, --wait returns it, an afterok job never starts" {
  local status=0 out
  out=$("$SUBMITTER" --site local -n 2 -g 2 -c 1 -W lightning -t 10 -e crash --wait -- "${train[@]}" --epochs 3 \
    --fail-at-step 5 --fail-rank 3 --ckpt-dir "$BATS_TEST_TMPDIR/crash" 2>&1) || status=$?
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  assert_equal "$status" 1
  assert_job_state "$job_id" FAILED
  assert_equal "$(job_field "$job_id" ExitCode)" 1:0
  run job_log "$job_id"
  assert_output --regexp 'task3 on node2 exited first, with code 1'
  local dependent
  dependent=$(sbatch --parsable --dependency="afterok:$job_id" -o /dev/null --wrap 'echo SHOULD-NOT-RUN')
  local deadline=$((SECONDS + 30)) reason=""
  until [[ "$reason" == DependencyNeverSatisfied ]]; do
    ((SECONDS < deadline)) || fail "dependent job $dependent: reason '$reason', state $(job_field "$dependent" JobState)"
    reason=$(job_field "$dependent" Reason)
    sleep 0.5
  done
  assert_equal "$(job_field "$dependent" JobState)" PENDING
  scancel "$dependent"
}

@test "two jobs of one submission folder (sbatch job.sbatch twice) on one node, the same data and experiment: separate folders and ports, no cross-talk, each cleans only its own" {
  local dir="$SCRATCH/$project/datasets/shared"
  mkdir -p "$dir"
  echo payload >"$dir/x.txt"
  local jobs=() k line out
  # The submitter refuses a second submission while the first runs; the same
  # folder sbatch-ed twice by hand still gives two jobs of one experiment.
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -n 1 -g 1 -c 1 -W torchrun -t 5 -e same -d datasets/shared \
    --sbatch-arg=--nodelist=node1 --no-submit -- \
    bash -c 'echo "job=$SLURM_JOB_ID tmp=$SLURM_TMPDIR port=$MASTER_PORT data=$(cat "$SLURM_TMPDIR/datasets/shared/x.txt")"; touch "$SLURM_TMPDIR/mine"; sleep 3; ls "$SLURM_TMPDIR"' </dev/null
  assert_success
  line=${lines[-1]}
  for k in 1 2; do
    out=$(eval "$line" 2>&1) || fail "'$line' failed: $out"
    jobs+=("${out##* }")
  done
  for k in "${jobs[@]}"; do
    wait_job_done "$k" 120
    assert_job_state "$k" COMPLETED
  done
  local a b
  a=$(job_log "${jobs[0]}" | sed -n 's/^job=[0-9]* \(.*\)/\1/p')
  b=$(job_log "${jobs[1]}" | sed -n 's/^job=[0-9]* \(.*\)/\1/p')
  [[ -n "$a" && -n "$b" ]] || fail "a job printed nothing: '$a' '$b'"
  [[ "${a%% port=*}" != "${b%% port=*}" ]] || fail "both jobs used the same local folder: $a"
  [[ "$(sed 's/.*port=\([0-9]*\).*/\1/' <<<"$a")" != "$(sed 's/.*port=\([0-9]*\).*/\1/' <<<"$b")" ]] || fail "same port: $a / $b"
  assert_equal "${a##* }" data=payload
  assert_equal "${b##* }" data=payload
  run find "$(local_tmpdir_base)" -mindepth 2 -maxdepth 2 \( -name "${jobs[0]}" -o -name "${jobs[1]}" \)
  assert_output ''
}

@test "scancel mid-run: the node-local folder is removed, the checkpoint folder keeps the last checkpoint" {
  submit -p notmpdir -n 1 -g 1 -c 1 -W none -t 10 -e cancelled -- "${train[@]}" --epochs 30 --step-sleep 0.05 \
    --ckpt-dir "$BATS_TEST_TMPDIR/cancelled"
  wait_log "$job_id" '^hpc_harness: step (2[0-9]|[3-9][0-9])/' 180
  scancel "$job_id"
  wait_job_done "$job_id" 60
  local deadline=$((SECONDS + 30)) dir
  dir="$(local_tmpdir_base)/$(id -un)/$job_id"
  while [[ -e "$dir" ]]; do
    ((SECONDS < deadline)) || fail "$dir still exists 30 s after scancel"
    sleep 0.3
  done
  run ls "$BATS_TEST_TMPDIR/cancelled"
  assert_output --regexp 'ckpt_step[0-9]+\.pt'
  refute_output --regexp '\.tmp'
}

@test "node-local disk too small for the data (a 1 MiB tmpfs as the local base): a message with both numbers, before training" {
  local base="$BATS_TEST_TMPDIR/tiny"
  mkdir -p "$base"
  mount -t tmpfs -o size=1m tmpfs "$base" 2>/dev/null || skip "cannot mount a tmpfs here"
  local site="$BATS_TEST_TMPDIR/site.conf"
  sed "s|^tmpdir_base = .*|tmpdir_base = $base|" "$REPO_ROOT/hpc_files/sites/local.conf" >"$site"
  mkdir -p "$SCRATCH/$project/datasets/big"
  head -c $((3 * 1024 * 1024)) /dev/urandom >"$SCRATCH/$project/datasets/big/blob.bin"
  local out
  out=$("$SUBMITTER" --site "$site" -p notmpdir -n 1 -g 1 -W none -t 5 -e tiny -d datasets/big -- echo TRAINING-STARTED 2>/dev/null)
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  wait_job_done "$job_id" 60
  umount "$base" || true
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --regexp 'not enough space in .*: the data needs [0-9]+ bytes, [0-9]+ bytes are free'
  refute_output --partial TRAINING-STARTED
}

@test "a job over its memory (-m 100M, 600 MiB allocated) under cgroups: killed, FAILED, its log names the oom-kill, status.sh says out of memory with exit 137" {
  [[ "$(scontrol show config)" == *"ProctrackType           = proctrack/cgroup"* ]] ||
    skip "this cluster runs without cgroups (see 'cluster.sh up')"
  submit -g 0 -m 100M -W none -t 5 -e oom -- python3 -c 'import time; x = bytearray(600 * 1024 * 1024); time.sleep(5)'
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --regexp 'Detected [0-9]+ oom[-_]kill event'
  run "$REPO_ROOT/hpc_files/status.sh" oom
  assert_success
  assert_line --index 3 --regexp '^0 +out of memory \(exit 137\) +0 '
}
