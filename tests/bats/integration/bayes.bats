#!/usr/bin/env bats
# method bayes on the real local cluster: 2 rounds x 3 trials of the example
# trainer. Round 1's controller job (afterany) tells Optuna round 1's results
# and submits round 2 from TPE; round 2's controller records the best trial;
# results.sh lists all 6 trials.

load '../test_helper'

RESULTS="$REPO_ROOT/hpc_files/results.sh"

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  "$REPO_ROOT/.venv/bin/python" -c 'import optuna' 2>/dev/null || skip "optuna is not installed (pip install -e '.[search]')"
  data=$(digits_dataset)
}

@test "method bayes, 2 rounds x 3 trials: round 2 is asked from Optuna after round 1 was told; 6 distinct trials; results.sh lists all 6" {
  # The trials take the example's default data folder, \$scratch_dir/datasets/digits.
  mkdir -p "$SCRATCH/$project/datasets"
  cp -r "$data" "$SCRATCH/$project/datasets/digits"
  submit -n 1 -g 0 -c 1 -W none -t 10 -e bo --sweep "$REPO_ROOT/tests/bats/fixtures/sweeps/bayes_example.yml" --rounds 2 --trials 3
  local exp="$SCRATCH/$project/bo" round1 round2
  round1=$(ls -d "$exp"/20*)
  # next_round is pending while the controller submits; then it names round 2's folder.
  wait_file "$round1/next_round" 400 '^/'
  round2=$(cat "$round1/next_round")
  [[ -d "$round2" && "$round2" != "$round1" ]] || fail "round 2's folder: '$round2'"
  wait_file "$round2/bayes_best.json" 400
  # Round 2's array runs tasks 3-5; its manifest lists rounds 1 and 2.
  assert_file_contains "$round2/job.sbatch" '^#SBATCH --array=3-5'
  run grep -c '"source":"bayes:round 2"' "$round2/trials.jsonl"
  assert_output 3
  # The journal: 6 trials, keyed by round and index; round 1's 3 were told
  # complete before round 2's were asked; 6 distinct parameter sets.
  run env PYTHONPATH="$REPO_ROOT/hpc_files" "$REPO_ROOT/.venv/bin/python" -c '
import json, sys
from hpc_tools import study
info = json.load(open(sys.argv[1] + "/bayes.json"))
s = study.open_study(info["journal"], info["study"], info["goal"], None)
ts = s.get_trials()
r1 = [t for t in ts if t.user_attrs["round"] == 1]
r2 = [t for t in ts if t.user_attrs["round"] == 2]
print(len(ts), len(r1), len(r2), sorted(t.user_attrs["trial"] for t in ts))
print("round 1:", " ".join(t.state.name for t in r1))
print("told before asked:", max(t.datetime_complete for t in r1) < min(t.datetime_start for t in r2))
print("distinct:", len({json.dumps(t.params, sort_keys=True) for t in ts}))
print("all complete:", all(t.state.name == "COMPLETE" for t in ts))
' "$round2" "$REPO_ROOT"
  assert_success
  assert_line "6 3 3 [0, 1, 2, 3, 4, 5]"
  assert_line "round 1: COMPLETE COMPLETE COMPLETE"
  assert_line "told before asked: True"
  assert_line "distinct: 6"
  assert_line "all complete: True"
  # Each trial in its own folder; the best one recorded by the last controller.
  local k
  for k in 0 1 2 3 4 5; do
    assert_file_exists "$exp/trials/$k/checkpoints/metrics.csv"
  done
  assert_file_contains "$round2/bayes_best.json" '"complete": 6'
  # results.sh: all 6 trials, finished, sorted by the sweep's metric.
  run "$RESULTS" bo --no-group -m test_acc
  assert_success
  assert_line --index 1 '6 trial(s); sorted by test_acc (max)'
  assert_equal "$(grep -cE '^[0-5] +1 +(16|32|64) +[0-9.e-]+ +finished +0\.[0-9]+' <<<"$output")" 6
  # Re-running round 1's controller tells nothing again and submits nothing.
  run env PYTHONPATH="$REPO_ROOT/hpc_files" "$REPO_ROOT/.venv/bin/python" -m hpc_tools.bayes controller --submission "$round1"
  assert_success
  assert_line "bayes: round 1/2: told 0 complete, 0 failed; 0 pruned early"
  assert_line --partial "round 2 was already submitted"
  assert_equal "$(ls -d "$exp"/20* | wc -l)" 2
}
