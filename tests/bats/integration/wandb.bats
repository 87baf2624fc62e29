#!/usr/bin/env bats
# The wandb-server sweep path (-w ENTITY/PROJECT/ID --sweep-count K) on the
# real local cluster: the real `wandb agent` CLI, inside the project's .venv,
# talks to the fake W&B backend of tests/python/fake_wandb.py on
# 127.0.0.1 (its grid points come from hpc_tools.trials). The API key is
# only in $HOME/wandb_credentials.txt (mode 600) and is read on the node; the
# fake refuses any other key (401), so a run that starts proves it got there.

load '../test_helper'

SWEEP_PATH=fake/proj/fakesw01

setup() {
  cluster_test_setup
  [[ -x "$REPO_ROOT/.venv/bin/wandb" ]] || fail "no wandb CLI in $REPO_ROOT/.venv (make deps)"
  # A private HOME holding the key; nothing else in the environment names it.
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  secret="c0ffee$(head -c 64 /dev/urandom | sha256sum | cut -c1-34)"
  (umask 077 && echo "$secret" >"$HOME/wandb_credentials.txt")
  unset WANDB_API_KEY WANDB_ENTITY WANDB_PROJECT WANDB_SWEEP_ID
  # What the agent needs, carried to the node by sbatch's default --export=ALL.
  export WANDB_MODE=offline WANDB_SILENT=true WANDB_ERROR_REPORTING=false \
    WANDB_AGENT_DISABLE_FLAPPING=true WANDB_DIR="$BATS_TEST_TMPDIR/wandb"
  mkdir -p "$WANDB_DIR"
  # An sbatch on PATH that records its argv (one word per line), then runs the real one.
  local real_sbatch
  real_sbatch=$(command -v sbatch) || fail "no sbatch on PATH"
  export STUB_SBATCH_ARGV_LOG="$BATS_TEST_TMPDIR/sbatch-argv.log"
  mkdir -p "$BATS_TEST_TMPDIR/bin"
  cat >"$BATS_TEST_TMPDIR/bin/sbatch" <<EOF
#!/usr/bin/env bash
printf '%s\n' "\$@" -- >>"\$STUB_SBATCH_ARGV_LOG"
exec $(printf '%q' "$real_sbatch") "\$@"
EOF
  chmod +x "$BATS_TEST_TMPDIR/bin/sbatch"
  export PATH="$BATS_TEST_TMPDIR/bin:$PATH"
  # The sweep's program: records what its run got in the trial's own folder
  # (one JSON line per run) and prints one line to the task's log; exits with
  # --exit (default 0).
  program="$BATS_TEST_TMPDIR/sweep_program.py"
  cat >"$program" <<'EOF'
import json, os, sys
exit_code = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--exit=")), 0)
run = {
    "args": sys.argv[1:],
    "trial": os.environ.get("HPC_TRIAL_INDEX"),
    "run_id": os.environ.get("WANDB_RUN_ID"),
    "sweep_id": os.environ.get("WANDB_SWEEP_ID"),
    "key_len": len(os.environ.get("WANDB_API_KEY", "")),
    "home": os.environ.get("HOME"),
}
with open(os.path.join(os.environ["HPC_TRIAL_DIR"], "runs.jsonl"), "a") as fh:
    fh.write(json.dumps(run) + "\n")
print("sweep_program: trial=%s run=%s args=%s key_len=%d exit=%d"
      % (run["trial"], run["run_id"], " ".join(run["args"]), run["key_len"], exit_code), flush=True)
sys.exit(exit_code)
EOF
}

teardown() {
  stop_fake_wandb
  cancel_test_jobs
}

# start_fake_wandb SWEEP_FILE: serve the sweep ($FAKE_LIFETIME s, default 180)
# with the test's key; sets WANDB_BASE_URL and fake_pid. The fake's state
# (agents, runs, their states and the points they got, preempted runs waiting
# to be handed out again) is rewritten to $fake_state as it changes. It reads
# the runs' own record files under $SCRATCH (the runs are offline).
start_fake_wandb() {
  local launcher="$BATS_TEST_TMPDIR/fake_launcher.py" ready="$BATS_TEST_TMPDIR/fake.url" deadline
  fake_state="$BATS_TEST_TMPDIR/fake_state.json"
  cat >"$launcher" <<'EOF'
import json, os, signal, sys, time
repo, sweep, ready, state, offline_root = sys.argv[1:6]
with open(os.path.join(os.environ["HOME"], "wandb_credentials.txt")) as fh:
    key = fh.read().strip()
sys.path.insert(0, os.path.join(repo, "tests", "python"))
from fake_wandb import FakeWandb

fake = FakeWandb(sweep, api_key=key, lifetime=float(os.environ.get("FAKE_LIFETIME", "180")),
                offline_root=offline_root).start()
signal.signal(signal.SIGTERM, lambda *_: fake.stop())
with open(ready + ".tmp", "w") as fh:
    fh.write(fake.url + "\n")
os.replace(ready + ".tmp", ready)
last = None
while True:
    fake.refresh()
    with fake.lock:
        now = json.dumps({"agents": sorted(fake.agents), "runs": fake.runs,
                          "next_point": fake.next_point, "points": fake.points,
                          "requeue": fake.requeue,
                          "requests": sorted(set(fake.requests))}, sort_keys=True)
    if now != last:
        with open(state + ".tmp", "w") as fh:
            fh.write(now)
        os.replace(state + ".tmp", state)
        last = now
    if fake.server is None:
        break
    time.sleep(0.2)
EOF
  # The launcher reads the key from the same file as the node (not from argv).
  "$REPO_ROOT/.venv/bin/python" "$launcher" "$REPO_ROOT" "$1" "$ready" "$fake_state" "$SCRATCH" \
    >"$BATS_TEST_TMPDIR/fake.log" 2>&1 3>&- &
  fake_pid=$!
  deadline=$((SECONDS + 30))
  until [[ -s "$ready" ]]; do
    kill -0 "$fake_pid" 2>/dev/null || fail "the fake W&B server exited: $(cat "$BATS_TEST_TMPDIR/fake.log")"
    ((SECONDS < deadline)) || fail "the fake W&B server did not start within 30 s: $(cat "$BATS_TEST_TMPDIR/fake.log")"
    sleep 0.2
  done
  WANDB_BASE_URL=$(<"$ready")
  export WANDB_BASE_URL
}

# stop_fake_wandb: TERM the fake (it stops serving and exits), KILL it after 5 s.
stop_fake_wandb() {
  local deadline=$((SECONDS + 5))
  [[ -n "${fake_pid:-}" ]] || return 0
  kill "$fake_pid" 2>/dev/null || true
  while kill -0 "$fake_pid" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.1
  done
  kill -KILL "$fake_pid" 2>/dev/null || true
  wait "$fake_pid" 2>/dev/null || true
  fake_pid=""
}

# submit_sweep_and_wait EXP COUNT: the wandb sweep through the submitter with
# --wait (bounded); sets job_id, status and submission.
submit_sweep_and_wait() {
  local out="$BATS_TEST_TMPDIR/submit.out"
  status=0
  timeout 150 "$SUBMITTER" --site local -W none -g 1 -c 1 -t 5 -e "$1" \
    -w "$SWEEP_PATH" --sweep-count "$2" --wait >"$out" 2>&1 || status=$?
  submit_output=$(<"$out")
  ((status != 124)) || fail "--wait did not return within 150 s: $submit_output"
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$submit_output")
  submission=$(sed -n 's/^  submission: //p' <<<"$submit_output")
  [[ -n "$job_id" && -d "$submission" ]] || fail "no job id or submission folder in: $submit_output"
}

# assert_wait_status CODE: --wait exited with CODE; otherwise fail showing the
# submitter's output and the end of every task's log.
assert_wait_status() {
  [[ "$status" == "$1" ]] && return 0
  fail "--wait exited $status, expected $1: $submit_output
$(tail -n 15 "$SCRATCH/${REPO_ROOT##*/}/hpc_outputs/"*"_${job_id}_"*.out 2>&1)"
}

# array_states JOB: 'TASK STATE EXITCODE' per array task of JOB, sorted by task.
array_states() {
  scontrol show job -o "$1" |
    sed -n "s/.* ArrayJobId=$1 ArrayTaskId=\([0-9]*\) .* JobState=\([A-Z_]*\) .* ExitCode=\([0-9:]*\) .*/\1 \2 \3/p" |
    sort -n
}

# task_log TASK: the log of array task TASK of job_id.
# shellcheck disable=SC2154 # project: set by cluster_test_setup (test_helper.bash, loaded by bats)
task_log() {
  cat "$SCRATCH/$project/hpc_outputs/${project}_${exp}_${job_id}_$1.out"
}

# fake_state_field EXPR: a python expression over the fake's state 's' (a tuple: its
# items, space-separated).
fake_state_field() {
  "$REPO_ROOT/.venv/bin/python" -c 'import json, sys; s = json.load(open(sys.argv[1])); v = eval(sys.argv[2]); print(*v) if isinstance(v, tuple) else print(v)' \
    "$fake_state" "$1"
}

@test "-w ENTITY/PROJECT/ID --sweep-count 3 --wait: one 3-task array, one 'wandb agent --count 1' run per task, 3 distinct grid points, all COMPLETED" {
  exp=wsweep
  cat >"$BATS_TEST_TMPDIR/sweep.yml" <<EOF
program: $program
method: grid
parameters:
  lr: {values: [0.1, 0.2]}
  layers: {values: [1, 2]}
EOF
  start_fake_wandb "$BATS_TEST_TMPDIR/sweep.yml"
  submit_sweep_and_wait "$exp" 3
  assert_wait_status 0
  # One sbatch call, one array job of 3 tasks, all COMPLETED with 0:0.
  run grep -c -x -- -- "$STUB_SBATCH_ARGV_LOG"
  assert_output 1
  run array_states "$job_id"
  assert_output "$(printf '%s COMPLETED 0:0\n' 0 1 2)"
  # Every task runs the same agent line (the server chooses the run).
  run cat "$submission/commands.txt"
  assert_output "$(printf 'wandb agent --count 1 %s\n' "$SWEEP_PATH" "$SWEEP_PATH" "$SWEEP_PATH")"
  # Each task ran exactly one run, through the toolkit's shim, in its own folder.
  local k runs=() line
  for k in 0 1 2; do
    run task_log "$k"
    assert_line 'hpc: wandb agent finished 1 run(s), all succeeded'
    assert_equal "$(grep -c '^sweep_program: ' <<<"$output")" 1
    assert_line --regexp "^sweep_program: trial=$k run=fakerun00[1-3] args=--layers=[12] --lr=0\.[12] key_len=40 exit=0\$"
    # The task's folder names the run it ran; the run's files live under its run id.
    run cat "$SCRATCH/$project/$exp/trials/$k/wandb_runs.txt"
    assert_output --regexp "^fakerun00[1-3] 0 $job_id\$"
    run cat "$SCRATCH/$project/$exp/runs/${output%% *}/runs.jsonl"
    assert_equal "${#lines[@]}" 1
    line=$("$REPO_ROOT/.venv/bin/python" -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["trial"], r["sweep_id"], r["key_len"], r["run_id"], " ".join(r["args"]))' "$output")
    assert_regex "$line" "^$k fakesw01 40 fakerun00[1-3] "
    runs+=("${line#* * * }")
  done
  # Three distinct runs with three distinct grid points: exactly the first three
  # of the grid, in trials.py's order (layers slowest, lr fastest).
  run printf '%s\n' "${runs[@]}"
  assert_equal "$(cut -d' ' -f1 <<<"$output" | sort -u | wc -l)" 3
  assert_equal "$(cut -d' ' -f2- <<<"$output" | sort)" \
    "$(printf '%s\n' '--layers=1 --lr=0.1' '--layers=1 --lr=0.2' '--layers=2 --lr=0.1')"
  # The server's side: three agents, three runs, three points handed out.
  assert_equal "$(fake_state_field 'len(s["agents"]), len(s["runs"]), s["next_point"]')" "3 3 3"
  assert_equal "$(fake_state_field 'sorted(tuple(sorted(r["params"].items())) for r in s["runs"].values()) == sorted(tuple(sorted(p.items())) for p in s["points"][:3])')" True
}

@test "-w sweep: the API key reaches the agent from ~/wandb_credentials.txt but never the script, sbatch's argv, the logs or the submission folder" {
  exp=wsecret
  cat >"$BATS_TEST_TMPDIR/sweep.yml" <<EOF
program: $program
method: grid
parameters:
  lr: {value: 0.3}
EOF
  start_fake_wandb "$BATS_TEST_TMPDIR/sweep.yml"
  submit_sweep_and_wait "$exp" 1
  assert_wait_status 0
  run array_states "$job_id"
  assert_output '0 COMPLETED 0:0'
  # The fake answers 401 to any other key: this run proves the key got there.
  run task_log 0
  assert_line --regexp '^sweep_program: trial=0 run=fakerun001 args=--lr=0\.3 key_len=40 exit=0$'
  refute_output --partial "$secret"
  # HOME reached the node through sbatch's default --export=ALL.
  run "$REPO_ROOT/.venv/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["home"])' \
    "$SCRATCH/$project/$exp/runs/fakerun001/runs.jsonl"
  assert_output "$HOME"
  run cat "$submission/job.sbatch"
  assert_success
  refute_output --partial "$secret"
  refute_output --partial WANDB_API_KEY
  run cat "$STUB_SBATCH_ARGV_LOG"
  assert_line job.sbatch
  refute_output --partial "$secret"
  assert_equal "$submit_output" "${submit_output//"$secret"/}"
  run grep -rlF -- "$secret" "$SCRATCH"
  assert_output ''
  run scontrol show job -dd "$job_id"
  refute_output --partial "$secret"
}

@test "-w sweep: a run exiting 7 (wandb agent itself exits 0) fails its own array task with 7 and --wait returns 7; the other task COMPLETED" {
  exp=wfail
  cat >"$BATS_TEST_TMPDIR/sweep.yml" <<EOF
program: $program
method: grid
parameters:
  exit: {values: [0, 7]}
EOF
  start_fake_wandb "$BATS_TEST_TMPDIR/sweep.yml"
  submit_sweep_and_wait "$exp" 2
  assert_wait_status 7
  # Which agent gets which point is the server's choice: find the failed task.
  run array_states "$job_id"
  assert_equal "${#lines[@]}" 2
  assert_equal "$(cut -d' ' -f2- <<<"$output" | sort | tr '\n' ,)" "COMPLETED 0:0,FAILED 7:0,"
  local failed ok
  failed=$(awk '$2 == "FAILED" {print $1}' <<<"$output")
  ok=$(awk '$2 == "COMPLETED" {print $1}' <<<"$output")
  run task_log "$failed"
  assert_line --regexp "^sweep_program: trial=$failed run=fakerun00[12] args=--exit=7 key_len=40 exit=7\$"
  assert_line --regexp '^hpc: error: wandb run fakerun00[12] exited with code 7 \(wandb agent reported success\)$'
  assert_output --partial 'training step ended with exit code 7'
  refute_output --partial 'all succeeded'
  run task_log "$ok"
  assert_line --regexp "^sweep_program: trial=$ok run=fakerun00[12] args=--exit=0 key_len=40 exit=0\$"
  assert_line 'hpc: wandb agent finished 1 run(s), all succeeded'
  assert_equal "$(fake_state_field 'len(s["agents"]), len(s["runs"])')" "2 2"
}

# release_until_done TASK SECONDS: lift SLURM's requeue hold each time the
# array task TASK (JOB_K) is requeued, until it ends; sets restarts.
release_until_done() {
  local task=$1 deadline=$((SECONDS + $2)) state
  restarts=0
  while :; do
    state=$(job_field "$task" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED) return 0 ;;
    esac
    ((SECONDS < deadline)) || fail "array task $task not done within $2 s ($state): $(job_log "$task" 2>&1 | tail -n 30)"
    if [[ "$state" == PENDING && "$(job_field "$task" Restarts)" -gt "$restarts" ]]; then
      restarts=$(job_field "$task" Restarts)
      release_requeued "$task" "$restarts"
    fi
    sleep 0.5
  done
}

@test "-w sweep: the wall-time signal mid-run checkpoints the run, marks it preempting and requeues the task, which gets the same run back from W&B and ends bitwise equal to an uninterrupted run" {
  exp=wwall
  local data
  data=$(digits_dataset)
  # One grid point, 180 steps x 0.1 s. The wall-time signal is sent as SLURM
  # sends it (USR1 to the batch shell) once the run is training: one requeue
  # however fast the machine is. (That --signal makes SLURM send it in time is
  # node.bats' wall-time test; waiting for it here took 4-7 requeues, minutes.)
  cat >"$BATS_TEST_TMPDIR/sweep.yml" <<EOF
program: hpc_harness/train.py
command:
  - \${env}
  - \${interpreter}
  - -m
  - hpc_harness.train
  - \${args}
method: grid
parameters:
  lr: {value: 0.004}
  seed: {value: 5}
  epochs: {value: 4}
  signal-check-every: {value: 1}
  checkpoint-every-s: {value: 0}
  step-sleep: {value: 0.1}
  log-every: {value: 5}
  wandb: {value: offline}
  data-dir: {value: "$data"}
EOF
  export FAKE_LIFETIME=420
  start_fake_wandb "$BATS_TEST_TMPDIR/sweep.yml"
  submit -W none -g 1 -c 1 -t 10 -e "$exp" -w "$SWEEP_PATH" --sweep-count 1
  local task="${job_id}_0" run_dir="$SCRATCH/$project/$exp/runs/fakerun001"
  wait_log "$task" '^hpc_harness: step (1[5-9]|[2-9][0-9])/' 240
  scancel --signal=USR1 --batch "$task"
  release_until_done "$task" 300
  assert_job_state "$task" COMPLETED
  assert_equal "$restarts" 1
  run job_log "$task"
  assert_output --partial 'received SIGUSR1'
  assert_output --partial 'wandb_agent.sh: received SIGUSR1; forwarding it to the wandb run'
  assert_output --partial 'hpc_harness: wandb run fakerun001 marked preempting'
  assert_output --partial 'wandb run fakerun001 checkpointed at SIGUSR1; exiting 42'
  assert_output --regexp "requeued $task \\(restart 1 of at most [0-9]+\\)"
  assert_output --regexp "resum(ed|ing) from .*runs/fakerun001/checkpoints/ckpt_step"
  assert_output --partial 'hpc: wandb agent finished 1 run(s), all succeeded'
  refute_output --partial fakerun002
  # The task ran one run, fakerun001, every time: preempted, ..., then finished.
  run cat "$SCRATCH/$project/$exp/trials/0/wandb_runs.txt"
  assert_equal "${lines[0]}" "fakerun001 42 $job_id"
  assert_equal "${lines[${#lines[@]} - 1]}" "fakerun001 0 $job_id"
  assert_equal "${#lines[@]}" $((restarts + 1))
  # W&B's side: one run, handed out once per start, finished; no new point used.
  assert_equal "$(fake_state_field 'len(s["runs"]), s["next_point"], s["runs"]["fakerun001"]["state"], len(s["runs"]["fakerun001"]["issued"])')" \
    "1 1 finished $((restarts + 1))"
  assert_file_exists "$run_dir/checkpoints/last.pt"
  # The uninterrupted run with the same hyperparameters (here, without the sleep
  # between steps, which changes no number) ends with the same weights, bitwise.
  OMP_NUM_THREADS=1 WANDB_MODE=disabled "$REPO_ROOT/.venv/bin/python" -m hpc_harness.train \
    --lr 0.004 --seed 5 --epochs 4 --signal-check-every 1 --checkpoint-every-s 0 --log-every 5 \
    --wandb disabled --data-dir "$data" --ckpt-dir "$BATS_TEST_TMPDIR/straight" >"$BATS_TEST_TMPDIR/straight.log" 2>&1 ||
    fail "the uninterrupted run failed: $(tail "$BATS_TEST_TMPDIR/straight.log")"
  assert_weights_equal "$BATS_TEST_TMPDIR/straight/last.pt" "$run_dir/checkpoints/last.pt"
}
