#!/usr/bin/env bash
# Start-up: from the first line of the batch script to the first training
# step, on the local SLURM cluster, interleaved after a discarded warm-up:
#   bare           sbatch of a script running python -c "import torch" (the anchor: the
#                  least any PyTorch job pays on that node)
#   ours_none      job_submitter.sh -g 0 -W none -- python -m hpc_harness.train
#   ours_torchrun  job_submitter.sh -g 2 -c 1 -W torchrun -- python -m hpc_harness.train
# The start is printed by the batch script's first line (a site-profile
# 'command' line for ours, the first line of the script for bare); the first
# step is the time metrics.csv gives step 1 (--log-every 1). Also shown:
# submission (fork) to that first batch-script line.
#
# Usage: bench/startup.sh [--smoke] [--reps N] [--out FILE]
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_options 5 "$@"

need_cluster
bench_workdir startup "${BENCH_WORK_DIR:-/var/tmp}"
bench_harness_job_setup
train=(python -m hpc_harness.train --epochs 1 --max-steps 3 --log-every 1 --no-resume --checkpoint-every 0)

# The anchor's batch script: bash (sbatch --wrap would use /bin/sh).
cat >"$work/bare.sbatch" <<EOF
#!/bin/bash
echo "bench: job start \${EPOCHREALTIME/,/.}"
"$BENCH_PY" -c "import torch"
echo "bench: first step \${EPOCHREALTIME/,/.}"
EOF
samples="$work/startup.tsv"
submit_samples="$work/submit.tsv"
# run_one CONFIG REP: submit, wait for the end, record start -> first step.
run_one() {
  local config=$1 rep=$2 exp="bench_startup_${1}_$2" output id log csv t_submit t_start t_first
  t_submit=$(now)
  case "$config" in
    bare)
      log="$work/bare_$rep.out"
      output=$(sbatch --parsable --partition=tmpdir --output="$log" "$work/bare.sbatch")
      id=${output%%;*}
      ;;
    ours_none | ours_torchrun)
      local layout=(-g 0 -W none)
      [[ "$config" == ours_none ]] || layout=(-g 2 -c 1 -W torchrun)
      output=$(cd "$work" && bash "$BENCH_ROOT/hpc_files/job_submitter.sh" --site "$site" "${layout[@]}" -e "$exp" \
        -- "${train[@]}" 2>&1) || bench_die "submission failed: $output"
      id=$(grep -oE '^Submitted job [0-9]+' <<<"$output" | grep -oE '[0-9]+')
      log="$SCRATCH/$project/hpc_outputs/${project}_${exp}_$id.out"
      csv="$SCRATCH/$project/$exp/checkpoints/metrics.csv"
      ;;
  esac
  track_job "$id"
  wait_job_gone "$id" 300 || bench_die "job $id ($config) still running after 300 s"
  t_start=$(sed -n 's/^bench: job start //p' "$log" | head -n 1)
  if [[ "$config" == bare ]]; then
    t_first=$(sed -n 's/^bench: first step //p' "$log" | head -n 1)
  else
    t_first=$(awk -F, '$4 == "train_loss" && $2 == 1 { print $1; exit }' "$csv" 2>/dev/null)
  fi
  [[ -n "$t_start" && -n "$t_first" ]] || bench_die "$config rep $rep (job $id): no start or first-step time; log: $(tail -n 20 "$log" 2>/dev/null)"
  if ((rep >= 0)); then
    record "$samples" "$config" "$rep" "$(diff_s "$t_start" "$t_first")"
    record "$submit_samples" "$config" "$rep" "$(diff_s "$t_submit" "$t_start")"
  fi
}

load_before=$(loadavg)
configs=(bare ours_none ours_torchrun)
run_rounds run_one "${configs[@]}"
cancel_submitted
load_after=$(loadavg)

commands="$work/commands.tsv"
{
  printf 'bare\t%s\n' 'sbatch (bash script): python -c "import torch"'
  printf 'ours_none\t%s\n' "job_submitter.sh -g 0 -W none -- ${train[*]}"
  printf 'ours_torchrun\t%s\n' "job_submitter.sh -g 2 -c 1 -W torchrun -- ${train[*]}"
} >"$commands"
section=$(
  printf '## 5. Start-up: batch script start to first training step\n\n'
  printf '%s interleaved reps after %s; one job at a time. Load before/after: %s / %s.\n\n' "$reps" \
    "$(warmup_note)" "$load_before" "$load_after"
  md_table "$samples" "$commands" bare "bare,ours_none,ours_torchrun"
  printf '\nFork of the submit command to the first line of the batch script (submission + scheduling):\n\n'
  md_table "$submit_samples" "$commands" bare "bare,ours_none,ours_torchrun"
)
bench_section "$section"
