#!/usr/bin/env bats
# --wandb-sync login on the local cluster: the example training job runs W&B
# offline and leaves wandb-osh triggers; hpc_files/wandb_sync.sh, started
# beside it as a user would on the login node, syncs each run live and once
# more after the job, then exits by itself.
#
# The W&B side is a stand-in `wandb` executable, not a server: `wandb sync`
# speaks W&B's upload protocol (GraphQL UpsertBucket, file_stream, file
# uploads through the wandb-core service), which tests/python/fake_wandb.py
# does not implement. The stand-in is first on the SYNCER's PATH only (the job
# gets the submitter's PATH, which lacks it): each `wandb sync .` it gets is
# recorded with the time, the folder and the history records the run's
# .wandb file holds at that moment (read with fake_wandb.read_records), which
# is what the real `wandb sync` would upload then.

load '../test_helper'

WANDB_SYNC="$REPO_ROOT/hpc_files/wandb_sync.sh"

setup() {
  cluster_test_setup
  "$REPO_ROOT/.venv/bin/python" -c 'import wandb, wandb_osh' || fail "no wandb or wandb-osh in .venv (make deps)"
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  unset WANDB_API_KEY WANDB_MODE HPC_WANDB
  # The job could not reach a W&B server here even if it tried.
  export WANDB_BASE_URL=http://127.0.0.1:9 WANDB_SILENT=true WANDB_ERROR_REPORTING=false
  standin_log="$BATS_TEST_TMPDIR/standin.jsonl"
  standin_bin="$BATS_TEST_TMPDIR/standin-bin"
  mkdir -p "$standin_bin"
  cat >"$BATS_TEST_TMPDIR/standin.py" <<'EOF'
import glob, json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "python"))
from fake_wandb import read_records

if sys.argv[2:4] != ["sync", "."]:
    sys.exit(f"stand-in wandb: unexpected arguments {sys.argv[2:]}")
seen = time.time()
(path,) = glob.glob("run-*.wandb")
for _ in range(50):  # the job may be writing a record right now: read again
    try:
        records = read_records(path)
        break
    except Exception:
        time.sleep(0.1)
history = []
for r in records:
    if r.WhichOneof("record_type") == "history":
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        history.append({"step": r.history.step.num, "epoch": items.get("epoch")})
kinds = [r.WhichOneof("record_type") for r in records]
with open(os.environ["STANDIN_LOG"], "a") as fh:
    fh.write(json.dumps({"time": seen, "dir": os.getcwd(), "history": history,
                         "exit": "exit" in kinds}) + "\n")
EOF
  cat >"$standin_bin/wandb" <<EOF
#!/usr/bin/env bash
exec $(printf '%q' "$REPO_ROOT/.venv/bin/python") $(printf '%q' "$BATS_TEST_TMPDIR/standin.py") $(printf '%q' "$REPO_ROOT") "\$@"
EOF
  chmod +x "$standin_bin/wandb"
}

teardown() {
  [[ -z "${sync_pid:-}" ]] || kill "$sync_pid" 2>/dev/null || true
  cancel_test_jobs
}

# standin EXPR: a python expression over the stand-in's calls 'calls' (a list
# of dicts, in order).
standin() {
  "$REPO_ROOT/.venv/bin/python" -c 'import json, sys
calls = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
print(eval(sys.argv[2]))' "$standin_log" "$1"
}

@test "--wandb-sync login: the job stays offline, the login-side syncer uploads each epoch while it runs and the finished run after it, then exits" {
  local exp=live data csv
  data=$(digits_dataset)
  # 4 epochs of 45 steps x 0.25 s: about 11 s each (longer than one round of
  # the syncer here), logged every 15 steps and at each epoch's end.
  submit -W none -g 0 -c 1 -t 10 -e "$exp" --wandb-sync login -- \
    python -m hpc_harness.train --epochs 4 --step-sleep 0.25 --log-every 15 --wandb auto --data-dir "$data"
  # The login node's side, as a user would start it (under tmux there).
  PATH="$standin_bin:$PATH" STANDIN_LOG="$standin_log" \
    "$WANDB_SYNC" "$exp" --poll 1 --wait 0.5 >"$BATS_TEST_TMPDIR/sync.log" 2>&1 3>&- &
  sync_pid=$!
  # Each epoch but the last (which the run's end follows at once) reaches the
  # stand-in while the run is still going: no exit record yet.
  local epoch deadline
  for epoch in 0 1 2; do
    deadline=$((SECONDS + 240))
    until [[ "$(standin "any(h['epoch'] == $epoch for c in calls for h in c['history'])")" == True ]]; do
      ((SECONDS < deadline)) || fail "epoch $epoch never reached the stand-in: $(tail -n 20 "$BATS_TEST_TMPDIR/sync.log"); job: $(job_log "$job_id" 2>&1 | tail -n 20)"
      sleep 0.5
    done
    assert_equal "$(standin "next(c for c in calls if any(h['epoch'] == $epoch for h in c['history']))['exit']")" False
  done
  # The syncer ends by itself once the job has ended, after one last sync.
  deadline=$((SECONDS + 300))
  while kill -0 "$sync_pid" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "wandb_sync.sh did not end after the job: $(tail -n 20 "$BATS_TEST_TMPDIR/sync.log")"
    sleep 0.5
  done
  wait "$sync_pid" || fail "wandb_sync.sh exited $?: $(cat "$BATS_TEST_TMPDIR/sync.log")"
  sync_pid=""
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_output --partial 'hpc_harness: wandb offline (--wandb-sync login: hpc_files/wandb_sync.sh uploads it)'
  assert_output --partial "hpc_harness: wandb-osh triggers in $SCRATCH/$project/$exp/wandb_osh"
  run cat "$BATS_TEST_TMPDIR/sync.log"
  assert_line "wandb_sync.sh: no job of $exp is queued or running (jobs: $job_id)"
  assert_line 'wandb_sync.sh: done'
  # The last upload is the finished run: its exit record and every step the
  # job logged (metrics.csv), all from the run's own folder.
  csv="$SCRATCH/$project/$exp/checkpoints/metrics.csv"
  assert_equal "$(standin "calls[-1]['exit']")" True
  assert_equal "$(standin "sorted({h['step'] for h in calls[-1]['history']})")" \
    "$("$REPO_ROOT/.venv/bin/python" -c 'import csv, sys; print(sorted({int(r["step"]) for r in csv.DictReader(open(sys.argv[1]))}))' "$csv")"
  assert_equal "$(standin "sorted({c['dir'] for c in calls})")" \
    "['$(cd "$SCRATCH/$project/$exp/checkpoints/wandb/" && echo "$PWD"/offline-run-*)']"
  run compgen -G "$SCRATCH/$project/$exp/wandb_osh/*.command"
  assert_failure
  # Seconds from each logged step (its metrics.csv time) to the first upload
  # that holds it: measured, not asserted (the machine is shared).
  "$REPO_ROOT/.venv/bin/python" - "$csv" "$standin_log" >"$BATS_TEST_TMPDIR/latency.txt" <<'EOF'
import csv, json, statistics, sys
logged = {}
for row in csv.DictReader(open(sys.argv[1])):
    logged.setdefault(int(row["step"]), float(row["time"]))
calls = [json.loads(line) for line in open(sys.argv[2])]
gaps = []
for step, at in sorted(logged.items()):
    first = next((c["time"] for c in calls if any(h["step"] == step for h in c["history"])), None)
    if first is not None:
        gaps.append(first - at)
print(f"log-to-upload seconds over {len(gaps)} steps: median {statistics.median(gaps):.1f}, "
      f"max {max(gaps):.1f}; {len(calls)} wandb sync calls")
EOF
  echo "# $(cat "$BATS_TEST_TMPDIR/latency.txt")" >&3
}
