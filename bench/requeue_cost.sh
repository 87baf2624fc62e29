#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in single quotes are Markdown code spans
# Requeue cost on the local SLURM cluster. Each rep submits the harness
# example through job_submitter.sh (1 node, torchrun, 2 processes):
#   job_submitter.sh --site BENCH_SITE -n 1 -g 2 -c 1 -W torchrun -- \
#     python -m hpc_harness.train --epochs 1000 --log-every 1 --step-sleep 0.02
# waits until it trained 150 steps (one periodic checkpoint behind it), sends
# 'scancel --signal=USR1 --batch JOB' (what SLURM sends before the wall time),
# and measures from metrics.csv (a wall-clock time per step), the requeue
# marker's mtime and squeue polled every 50 ms:
#   signal -> checkpoint complete (marker written) -> job no longer RUNNING;
#   steps lost (last trained step vs the checkpoint's step);
#   'scontrol update JobId=N StartTime=now' -> RUNNING -> first resumed step;
#   checkpoint size and write time (hpc_harness.checkpoint.atomic_save of the
#   same checkpoint, 10 times) vs 'dd bs=1M count=256 conv=fdatasync'.
# --smoke (seconds: one job, end to end, and the tables): the signal at step
# 10, dd of 16 MiB, and no wait for the cancelled job to leave before the
# anchors (the clean-up at exit waits for it).
# BENCH_SITE is the local profile plus a line printing the job's start time.
#
# Usage: bench/requeue_cost.sh [--smoke] [--reps N] [--out FILE]
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_options 3 "$@"

need_cluster
bench_workdir requeue "${BENCH_WORK_DIR:-/var/tmp}"
bench_harness_job_setup
signal_at_step=150
dd_mib=256
if [[ -n "$smoke" ]]; then
  signal_at_step=10
  dd_mib=16
fi
dd_config="dd_${dd_mib}MiB_fdatasync"

# last_step CSV: the newest (time, step) row of the train_loss metric.
last_row() {
  awk -F, '$4 == "train_loss" { t = $1; s = $2 } END { if (s != "") print t, s }' "$1" 2>/dev/null
}

# first_row_after CSV LINES: the first train_loss row below the first LINES
# lines (the interrupted attempt's rows): the resumed attempt's first step.
first_row_after() {
  awk -F, -v lines="$2" 'NR > lines && $4 == "train_loss" { print $1, $2; exit }' "$1" 2>/dev/null
}

wait_for() { # wait_for SECONDS COMMAND...: poll every 50 ms until COMMAND succeeds
  local limit=$1 t0=$SECONDS
  shift
  until "$@"; do
    ((SECONDS - t0 < limit)) || return 1
    sleep 0.05
  done
}

csv_reached() { # csv_reached CSV STEP
  local row
  row=$(last_row "$1")
  [[ -n "$row" && "${row#* }" -ge "$2" ]]
}

state_is_not() { [[ "$(job_state "$1")" != "$2" ]]; }
state_is() { [[ "$(job_state "$1")" == "$2" ]]; }
resumed() { [[ -n "$(first_row_after "$1" "$2")" ]]; }

samples="$work/requeue.tsv"
sizes="$work/sizes.tsv"
load_before=$(loadavg)
for ((r = 0; r < reps; r++)); do
  exp="bench_requeue_$r"
  output=$(cd "$work" && bash "$BENCH_ROOT/hpc_files/job_submitter.sh" --site "$site" -n 1 -g 2 -c 1 -W torchrun \
    -e "$exp" -- python -m hpc_harness.train --epochs 1000 --log-every 1 --step-sleep 0.02 2>&1) ||
    bench_die "submission failed: $output"
  id=$(grep -oE '^Submitted job [0-9]+' <<<"$output" | grep -oE '[0-9]+')
  track_job "$id"
  submission=$(sed -n 's/^  submission: //p' <<<"$output")
  csv="$SCRATCH/$project/$exp/checkpoints/metrics.csv"
  log="$SCRATCH/$project/hpc_outputs/${project}_${exp}_$id.out"
  wait_for 120 csv_reached "$csv" "$signal_at_step" || bench_die "job $id did not reach step $signal_at_step; log: $(tail -n 20 "$log" 2>/dev/null)"
  t_sig=$(now)
  scancel --signal=USR1 --batch "$id"
  wait_for 120 state_is_not "$id" RUNNING || bench_die "job $id still RUNNING 120 s after USR1"
  t_left=$(now)
  marker="$submission/runs/$id/requeue_marker"
  [[ -f "$marker" ]] || bench_die "job $id left no requeue marker; log: $(tail -n 20 "$log")"
  t_marker=$(file_mtime "$marker")
  ckpt_step=$("$BENCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$marker")
  ckpt_file=$("$BENCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$marker")
  read -r t_last_step last_step < <(last_row "$csv")
  attempt_lines=$(wc -l <"$csv")
  wait_for 60 state_is "$id" PENDING || bench_die "job $id not PENDING after the requeue (state $(job_state "$id"))"
  t_pending=$(now)
  # Release it (scontrol requeue holds it for about 2 minutes), but not within
  # 2 s of the requeue: slurmd compares credential times in whole seconds and
  # refuses a launch in the same second ('Job credential revoked'), as the
  # tests' release_requeued does.
  requeued_at=$(date -d "$(scontrol show job "$id" | grep -oE 'SubmitTime=[^ ]+' | cut -d= -f2)" +%s)
  until (($(date +%s) >= requeued_at + 2)); do sleep 0.05; done
  t_rel=$(now)
  scontrol update JobId="$id" StartTime=now
  wait_for 120 state_is "$id" RUNNING || bench_die "job $id did not start again"
  t_running=$(now)
  wait_for 120 resumed "$csv" "$attempt_lines" || bench_die "job $id trained no step after the requeue; log: $(tail -n 20 "$log")"
  read -r t_first first_step < <(first_row_after "$csv" "$attempt_lines")
  if ! grep -q "^hpc_harness: resumed from .* (global step $ckpt_step)\$" "$log" || ((first_step != ckpt_step + 1)); then
    bench_die "job $id did not resume its checkpoint of step $ckpt_step (first step after the requeue: $first_step); log: $(tail -n 20 "$log")"
  fi
  t_start2=$(grep -oE '^bench: job start [0-9.]+' "$log" | sed -n '2s/bench: job start //p')
  scancel "$id"
  # The next rep and the anchors below run on a machine this job has left
  # (a smoke run has neither a next rep nor numbers to keep).
  if [[ -z "$smoke" ]]; then
    wait_job_gone "$id" 60 || bench_note "warning: job $id still listed after scancel"
  fi

  record "$samples" signal_to_checkpoint "$r" "$(diff_s "$t_sig" "$t_marker")"
  record "$samples" signal_to_off_node "$r" "$(diff_s "$t_sig" "$t_left")"
  record "$samples" signal_to_pending "$r" "$(diff_s "$t_sig" "$t_pending")"
  record "$samples" pending_to_release "$r" "$(diff_s "$t_pending" "$t_rel")"
  record "$samples" release_to_running "$r" "$(diff_s "$t_rel" "$t_running")"
  record "$samples" job_start_to_first_step "$r" "$(diff_s "${t_start2:-$t_running}" "$t_first")"
  record "$samples" release_to_first_step "$r" "$(diff_s "$t_rel" "$t_first")"
  record "$samples" signal_to_last_step "$r" "$(diff_s "$t_sig" "$t_last_step")"
  printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$ckpt_step" "$last_step" "$first_step" "$(stat -c %s "$ckpt_file")" >>"$sizes"

  # Anchors, beside this rep: the same checkpoint rewritten by the harness's
  # own atomic_save, and the disk's synced write bandwidth.
  PYTHONPATH="$BENCH_ROOT" "$BENCH_PY" - "$ckpt_file" "$work/ckpt_write" "$r" "$samples" <<'PY'
import os, statistics, sys, time
import torch
from hpc_harness.checkpoint import atomic_save
src, folder, rep, samples = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
state = torch.load(src, map_location="cpu", weights_only=False)
os.makedirs(folder, exist_ok=True)
times = []
for i in range(10):
    t0 = time.perf_counter()
    atomic_save(state, os.path.join(folder, f"ckpt_{i}.pt"))
    times.append(time.perf_counter() - t0)
with open(samples, "a") as f:
    f.write(f"checkpoint_atomic_save\t{rep}\t{statistics.median(times):.6f}\n")
PY
  t0=$(now)
  dd if=/dev/zero of="$work/dd.bin" bs=1M count="$dd_mib" conv=fdatasync status=none
  dd_s=$(since "$t0")
  rm -f "$work/dd.bin"
  record "$samples" "$dd_config" "$r" "$dd_s"
  bench_note "rep $r: checkpoint step $ckpt_step, last trained step $last_step, first resumed step $first_step"
done
cancel_submitted
load_after=$(loadavg)

commands="$work/commands.tsv"
{
  printf 'signal_to_checkpoint\t%s\n' "scancel --signal=USR1 --batch -> requeue marker written (checkpoint complete)"
  printf 'signal_to_off_node\t%s\n' "scancel --signal=USR1 --batch -> squeue state no longer RUNNING"
  printf 'signal_to_pending\t%s\n' "... -> PENDING (requeued, waiting for its EligibleTime)"
  printf 'pending_to_release\t%s\n' "(forced wait) PENDING -> 2 s after the requeue, the earliest safe 'scontrol update StartTime=now'"
  printf 'release_to_running\t%s\n' "scontrol update JobId=N StartTime=now -> RUNNING"
  printf 'job_start_to_first_step\t%s\n' "first line of the batch script -> first resumed step (metrics.csv)"
  printf 'release_to_first_step\t%s\n' "scontrol update ... StartTime=now -> first resumed step"
  printf 'signal_to_last_step\t%s\n' "signal -> end of the last step trained (the one checkpointed)"
  printf 'checkpoint_atomic_save\t%s\n' "hpc_harness.checkpoint.atomic_save of the same checkpoint (median of 10)"
  printf '%s\t%s\n' "$dd_config" "dd if=/dev/zero of=F bs=1M count=$dd_mib conv=fdatasync"
} >"$commands"

section=$(
  printf '## 4. Requeue cost (harness example, 1 node, torchrun x 2 processes)\n\n'
  printf 'Signal sent at step >= %s of `python -m hpc_harness.train --log-every 1 --step-sleep 0.02` (about 40 steps/s; stop-flag checks adaptive, about every 0.5 s); %s reps (one job each). Load before/after: %s / %s.\n\n' \
    "$signal_at_step" "$reps" "$load_before" "$load_after"
  md_table "$samples" "$commands" "" "signal_to_checkpoint,signal_to_off_node,signal_to_pending,pending_to_release,release_to_running,job_start_to_first_step,release_to_first_step,signal_to_last_step,checkpoint_atomic_save,$dd_config"
  printf '\n| rep | checkpoint step | last trained step | steps lost | first resumed step | checkpoint bytes |\n| --- | --- | --- | --- | --- | --- |\n'
  awk -F '\t' '{ lost = $3 - $2; if (lost < 0) lost = 0; printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, lost, $4, $5 }' "$sizes"
  bytes=$(awk -F '\t' 'NR == 1 { print $5 }' "$sizes")
  dd_med=$(median "$samples" "$dd_config")
  save_med=$(median "$samples" checkpoint_atomic_save)
  awk -v b="$bytes" -v dd="$dd_med" -v mib="$dd_mib" -v s="$save_med" 'BEGIN {
    bw = mib * 1048576 / dd
    printf "\nDisk: %.0f MiB/s synced (dd). The checkpoint (%d bytes) would take %.2f ms at that bandwidth; atomic_save takes %.2f ms (%.1fx): at this size the cost is the fsyncs and torch.save, not bandwidth.\n", bw / 1048576, b, b / bw * 1000, s * 1000, s / (b / bw)
  }'
)
bench_section "$section"
