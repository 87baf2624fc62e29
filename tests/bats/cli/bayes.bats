#!/usr/bin/env bats
# method bayes with a stubbed sbatch: round 1 is an array job of --trials
# tasks asked from Optuna, followed by a controller job (afterany); the
# journal study holds round 1; --dry-run and --list-trials write nothing;
# bad values are refused with one line. No cluster needed.

load '../test_helper'
load 'cli_helper'

BAYES="$FIXTURES/sweeps/bayes_example.yml"

setup() {
  cli_setup
  "$HPC_PYTHON" -c 'import optuna' 2>/dev/null || skip "optuna is not installed (pip install -e '.[search]')"
  stub_sbatch_recording
}

# A guard against a hang, not a bound on what a test checks: a submission
# imports Optuna, seconds under make test's load.
HANG=300

# sbatch_call N: the argv of the Nth sbatch call (1-based), one word per line.
sbatch_call() {
  awk -v n="$1" '$0 == "--" { k++; next } k == n - 1' "$STUB_SBATCH_LOG"
}

@test "--sweep bayes.yml --rounds 2 --trials 3: round 1 (3 tasks from Optuna) and a controller job after it" {
  run --separate-stderr timeout "$HANG" "$SUBMITTER" --site local -g 0 -W none -e bo --sweep "$BAYES" --rounds 2 --trials 3 </dev/null
  ((status == 0)) || fail "exit $status: $stderr"
  assert_output --partial "Submitted job 4242 (3 trial(s)"
  [[ "$stderr" == *"bayes: round 1 of 2; controller job 4242 runs after job 4242"* ]] || fail "stderr: $stderr"
  local sub
  sub=$(find "$SCRATCH/$PROJECT/bo" -mindepth 1 -maxdepth 1 -name '20*' -type d)
  [[ -n "$sub" && "$sub" != *$'\n'* ]] || fail "one submission folder expected: $sub"
  run grep -c '"source":"bayes:round 1"' "$sub/trials.jsonl"
  assert_output 3
  run cat "$sub/commands.txt"
  assert_line --index 0 --regexp '^/usr/bin/env python -m hpc_harness.train --epochs=1 --hidden=(16|32|64) --lr=0\.[0-9]+$'
  assert_file_contains "$sub/job.sbatch" '^#SBATCH --array=0-2'
  # Two sbatch calls: the round's array job, then the controller.
  assert_equal "$(grep -cx -- -- "$STUB_SBATCH_LOG")" 2
  run sbatch_call 2
  assert_line -- '--dependency=afterany:4242'
  assert_line -- '--cpus-per-task=1'
  assert_line --regexp "^--wrap=cd .*/hpc_files'? && exec .* -m hpc_tools\.bayes controller --submission '.*/bo/20[0-9-]+-[A-Za-z0-9]+' --project "
  # The journal study, named after the folder, holds round 1's 3 trials, and the
  # folder records what the controller needs.
  assert_file_exists "$SCRATCH/$PROJECT/bo/optuna.journal"
  run env PYTHONPATH="$REPO_ROOT/hpc_files" "$HPC_PYTHON" -c '
import json, sys
from hpc_tools import study
info = json.load(open(sys.argv[1] + "/bayes.json"))
s = study.open_study(info["journal"], info["study"], info["goal"], None)
print(info["round"], info["rounds"], info["metric"], info["goal"], len(s.get_trials()), sorted(t.user_attrs["trial"] for t in s.get_trials()))
' "$sub" "$REPO_ROOT"
  assert_success
  assert_output "1 2 test_acc maximize 3 [0, 1, 2]"
  assert_file_contains "$sub/bayes_controller_job_id" '^4242$'
}

@test "--list-trials shows round 1 from Optuna (seeded: the same twice); --dry-run previews a 3-task array; both write nothing" {
  local first second
  first=$("$SUBMITTER" --site local --sweep "$BAYES" --rounds 2 --trials 3 --list-trials)
  second=$("$SUBMITTER" --site local --sweep "$BAYES" --rounds 2 --trials 3 --list-trials)
  assert_equal "$first" "$second"
  assert_equal "$(grep -c '"source":"bayes:round 1"' <<<"$first")" 3
  other=$("$SUBMITTER" --site local --sweep "$BAYES" --rounds 2 --trials 3 --sweep-seed 5 --list-trials)
  [[ "$other" != "$first" ]] || fail "another --sweep-seed gave the same trials"
  dry --site local -g 0 -W none -e bo --sweep "$BAYES" --rounds 2 --trials 3
  assert_line '#SBATCH --array=0-2%4'
  assert_equal "$(scratch_listing | grep -c optuna)" 0
  [[ ! -e "$STUB_SBATCH_LOG" ]] || fail "sbatch was called"
}

@test "bad method-bayes values are refused with one line, nothing written" {
  local nometric="$BATS_TEST_TMPDIR/nometric.yml" grid="$BATS_TEST_TMPDIR/grid.yml"
  grep -v -e '^metric:' -e '^  name:' -e '^  goal:' "$BAYES" >"$nometric"
  printf 'program: t.py\nmethod: grid\nparameters: {x: {values: [1, 2]}}\n' >"$grid"
  refuse "--rounds must be at least 1, got '0'" -- --site local --sweep "$BAYES" --rounds 0 --trials 3
  refuse "method bayes needs metric: with name:" -- --site local --sweep "$nometric" --rounds 2 --trials 3
  refuse "method bayes needs --trials N" -- --site local --sweep "$BAYES" --rounds 2
  refuse "--rounds applies to method bayes only" -- --site local --sweep "$grid" --rounds 2
  refuse "--rounds only applies with --sweep" -- --site local --rounds 2 -- true
}

@test "a second method-bayes search in an experiment whose trials/K folders an earlier search used is refused: its trials would number from 0 again and resume them" {
  run --separate-stderr timeout "$HANG" "$SUBMITTER" --site local -g 0 -W none -e bo2 --sweep "$BAYES" --rounds 1 --trials 2 </dev/null
  ((status == 0)) || fail "exit $status: $stderr"
  # The first search's tasks ran: their folders hold checkpoints.
  mkdir -p "$SCRATCH/$PROJECT/bo2/trials/0/checkpoints" "$SCRATCH/$PROJECT/bo2/trials/1"
  rm -f "$STUB_SBATCH_LOG"
  refuse "experiment 'bo2' holds the trial folders of an earlier search (trials/0 ...); a new method-bayes search numbers its trials from 0 again and would resume theirs: use another -e" -- \
    --site local -g 0 -W none -e bo2 --sweep "$BAYES" --rounds 1 --trials 2 --sweep-seed 2
  refuse "experiment 'bo2' holds the trial folders of an earlier search" -- \
    --dry-run --site local -g 0 -W none -e bo2 --sweep "$BAYES" --rounds 1 --trials 2 --sweep-seed 2
}

@test "--no-submit is refused for method bayes: its rounds are submitted by controller jobs, which nothing would queue" {
  refuse "method bayes runs as rounds of jobs submitted by a controller job after each; --no-submit would leave one round of random trials and no search: submit it, or use method random" -- \
    --site local -g 0 -W none -e bo3 --sweep "$BAYES" --rounds 2 --trials 2 --no-submit
}

@test "a controller submits the next round, but not in an experiment stop.sh stopped (it records the best instead)" {
  run --separate-stderr timeout "$HANG" "$SUBMITTER" --site local -g 0 -W none -e bo --sweep "$BAYES" --rounds 2 --trials 2 </dev/null
  ((status == 0)) || fail "exit $status: $stderr"
  local sub
  sub=$(find "$SCRATCH/$PROJECT/bo" -mindepth 1 -maxdepth 1 -name '20*' -type d)
  echo "stopped by a test" >"$SCRATCH/$PROJECT/bo/stopped"
  run --separate-stderr timeout "$HANG" env PYTHONPATH="$REPO_ROOT/hpc_files" "$HPC_PYTHON" -m hpc_tools.bayes controller --submission "$sub" --project "$PROJECT"
  ((status == 0)) || fail "exit $status: $stderr"
  assert_output --partial "stopped exists (stop.sh); round 2 is not submitted"
  assert_equal "$(grep -cx -- -- "$STUB_SBATCH_LOG")" 2
  assert_file_exists "$sub/bayes_best.json"
  assert_not_exist "$sub/next_round"
  # Not stopped: the same controller submits round 2 (its array job and its controller).
  rm "$SCRATCH/$PROJECT/bo/stopped"
  run --separate-stderr timeout "$HANG" env PYTHONPATH="$REPO_ROOT/hpc_files" "$HPC_PYTHON" -m hpc_tools.bayes controller --submission "$sub" --project "$PROJECT"
  ((status == 0)) || fail "exit $status: $stderr"
  assert_equal "$(grep -cx -- -- "$STUB_SBATCH_LOG")" 4
}
