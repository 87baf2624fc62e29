#!/usr/bin/env bats
# early_terminate offline on the real local cluster: the trials of a grid and
# of a 2-round bayes search report val_acc each epoch (hpc_harness.pieces.
# should_stop_trial in programs/curve_trial.py, whose curve depends on lr
# alone) to Optuna's pruner over the experiment's journal; pruned trials
# checkpoint and exit 0; status.sh and results.sh show PRUNED with the step.
# One task at a time (--array-throttle 1): which trial is pruned where then
# depends on the order of the trials, never on timing.

load '../test_helper'

SWEEPS="$REPO_ROOT/tests/bats/fixtures/sweeps"
STATUS="$REPO_ROOT/hpc_files/status.sh"
RESULTS="$REPO_ROOT/hpc_files/results.sh"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  "$REPO_ROOT/.venv/bin/python" -c 'import optuna' 2>/dev/null || skip "optuna is not installed (pip install -e '.[search]')"
}

@test "a 9-trial grid with early_terminate: bad learning rates pruned at their first rung, the best completes; status and results show PRUNED" {
  submit -n 1 -g 0 -c 1 -W none -t 5 -e egrid --sweep "$SWEEPS/early_grid.yml" --array-throttle 1
  local exp="$SCRATCH/$project/egrid" sub k
  sub=$(ls -d "$exp"/20*)
  assert_file_contains "$sub/early_terminate.json" '"min_resource": 1'
  wait_array_done "$job_id" 9 600
  # Pruned trials end cleanly: every task COMPLETED (exit 0).
  run array_states "$job_id"
  assert_output "$(printf '%s COMPLETED\n' 0 1 2 3 4 5 6 7 8)"
  # lr 0.1 (trial 0) runs its 9 epochs; lr 0.3 leads after epoch 1 and is
  # pruned at rung 2 (epoch 3); the other 7 at rung 1, with their checkpoint.
  assert_file_not_exists "$exp/trials/0/pruned"
  assert_equal "$(grep -c ',val_acc,' "$exp/trials/0/metrics.csv")" 9
  assert_equal "$(cut -d' ' -f1 "$exp/trials/1/pruned")" 3
  for k in 2 3 4 5 6 7 8; do
    assert_equal "$(cut -d' ' -f1 "$exp/trials/$k/pruned")" 1
    assert_equal "$(cat "$exp/trials/$k/checkpoint.txt")" 1
  done
  assert_file_contains "${SCRATCH}/$project/hpc_outputs/${project}_egrid_${job_id}_2.out" '^hpc_harness: pruned at step 1: val_acc 0.21'
  run "$STATUS" egrid
  assert_success
  assert_line --regexp '^0 +COMPLETED '
  assert_line --regexp '^1 +PRUNED at step 3 '
  assert_equal "$(grep -cE '^[2-8] +PRUNED at step 1 ' <<<"$output")" 7
  run "$RESULTS" egrid --no-group
  assert_success
  assert_line --index 1 '9 trial(s); sorted by val_acc (max)'
  assert_line --regexp '^0 +9 +0\.1 +finished +0\.89'
  assert_line --regexp '^1 +9 +0\.3 +PRUNED at step 3 +0\.66'
  assert_equal "$(grep -cE '^[2-8] +9 +[0-9.]+ +PRUNED at step 1 ' <<<"$output")" 7
}

@test "method bayes, 2 rounds x 3 trials with early_terminate: worse learning rates pruned at the first rung, the best completes; told PRUNED in the journal" {
  submit -n 1 -g 0 -c 1 -W none -t 5 -e ebayes --sweep "$SWEEPS/early_bayes.yml" --rounds 2 --trials 3 --array-throttle 1
  local exp="$SCRATCH/$project/ebayes" round1 round2
  round1=$(ls -d "$exp"/20*)
  wait_file "$round1/next_round" 600 '^/'
  round2=$(cat "$round1/next_round")
  wait_file "$round2/bayes_best.json" 600
  # Both rounds' folders name the same study in the same journal.
  assert_equal "$(grep '"study"' "$round1/early_terminate.json")" "$(grep '"study"' "$round2/early_terminate.json")"
  assert_file_contains "$round2/early_terminate.json" '"last_rung": 3'
  # The journal: per trial, its lr, state and the step its pruned file names.
  run env PYTHONPATH="$REPO_ROOT/hpc_files" "$REPO_ROOT/.venv/bin/python" -c '
import json, os, sys
from hpc_tools import study
info = json.load(open(sys.argv[1] + "/bayes.json"))
s = study.open_study(info["journal"], info["study"], info["goal"], None)
rows = []
for t in s.get_trials():
    k = t.user_attrs["trial"]
    path = os.path.join(sys.argv[3], "trials", str(k), "pruned")
    step = open(path).read().split()[0] if os.path.exists(path) else "-"
    rows.append((t.params["lr"], t.state.name, step, t.user_attrs["round"]))
best = max(rows, key=lambda r: abs(__import__("math").log10(r[0]) + 1) * -1)
print("trials:", len(rows))
print("round 1 pruned:", sum(r[1] == "PRUNED" and r[3] == 1 for r in rows))
print("best lr", best[0], best[1])
print("pruned:", sum(r[1] == "PRUNED" for r in rows), "at step 1:", sum(r[2] == "1" for r in rows))
print("pruned lrs worse than the best:", all(r[0] != best[0] for r in rows if r[1] == "PRUNED"))
print("files match states:", all((r[1] == "PRUNED") == (r[2] != "-") for r in rows))
' "$round2" "$REPO_ROOT" "$exp"
  assert_success
  assert_line "trials: 6"
  assert_line --regexp '^best lr [0-9.]+ COMPLETE$'
  assert_line --regexp '^pruned: [1-9] at step 1: [1-9]$'
  assert_line "pruned lrs worse than the best: True"
  assert_line "files match states: True"
  local round1_pruned
  round1_pruned=$(sed -n 's/^round 1 pruned: //p' <<<"$output")
  # Round 1's controller counts its pruned trials apart from the complete and failed.
  run grep -h '^bayes: round 1/2: told ' "$SCRATCH/$project/hpc_outputs/"*_ebayes_bayes_*.out
  assert_output --regexp "^bayes: round 1/2: told $((3 - round1_pruned)) complete, 0 failed; $round1_pruned pruned early\$"
  run "$RESULTS" ebayes --no-group
  assert_success
  assert_line --index 1 '6 trial(s); sorted by val_acc (max)'
  assert_line --regexp '^[0-5] +9 +[0-9.]+ +finished +0\.[0-9]+'
  assert_line --regexp 'PRUNED at step 1 '
  run "$STATUS" ebayes
  assert_success
  assert_line --regexp '^[3-5] +(COMPLETED|PRUNED at step [13]) '
}
