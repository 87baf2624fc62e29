#!/usr/bin/env bats
# hpc_files/lib/trials.sh: the manifest comes from trials.py alone, for every
# source: trials.jsonl and commands.txt. A command after '--' reaches it as a
# configs file of one line, its words quoted (shell_quote): that line is its
# commands.txt line, and its manifest the one --list-trials prints.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/trials.sh
source "$HPC_FILES_DIR/lib/trials.sh"

setup() {
  source_dir=$REPO_ROOT
  PYTHON="$REPO_ROOT/.venv/bin/python"
  [[ -x "$PYTHON" ]] || PYTHON=python3
  HPC_PYTHON=$PYTHON
  opt_command=()
  opt_seeds="" opt_configs="" opt_sweep="" opt_wandb_sweep="" opt_sweep_count=""
  HPC_CLEANUP_PATHS=()
  OUT="$BATS_TEST_TMPDIR/out dir"
}

# write_trials DIR: a submission's two halves back to back.
write_trials() {
  start_trials "$1"
  finish_trials
}

teardown() {
  run_cleanup
}

# one_command WORD...: '-- WORD...' is one trial: commands.txt is its words
# quoted on one line, and trials.jsonl what --list-trials prints.
one_command() {
  local listed
  opt_command=("$@")
  rm -rf -- "$OUT" && mkdir -p "$OUT"
  write_trials "$OUT"
  assert_equal "$trials_count" 1
  printf '%s\n' "$(shell_quote "$@")" | cmp -s - "$OUT/commands.txt" ||
    fail "commands.txt for $(printf '%q ' "$@") is not its words quoted: $(cat -A "$OUT/commands.txt")"
  listed=$(list_trials) || fail "trials.py refused: $(printf '%q ' "$@")"
  [[ "$(cat "$OUT/trials.jsonl")" == "$listed" ]] ||
    fail "trials.jsonl differs from --list-trials for $(printf '%q ' "$@"): $(cat "$OUT/trials.jsonl") vs $listed"
}

@test "a command after '--': commands.txt is its words quoted, trials.jsonl the manifest --list-trials prints" {
  one_command python train.py --lr 0.1
  assert_equal "$(cat "$OUT/commands.txt")" "python train.py --lr 0.1"
  assert_equal "$(list_trials)" '{"argv":["python","train.py","--lr","0.1"],"params":{},"source":"configs:1","trial":0}'
  one_command python train.py 'two words' "it's" '' ' '
  assert_equal "$(cat "$OUT/commands.txt")" "python train.py 'two words' 'it'\\''s' '' ' '"
  one_command python -c 'print("hi")' "\$HOME" '${x}' "\$(touch pwned)" '`touch pwned`'
  one_command a\\b 'c\' '\\' '"' "'" "\"'\"" 'a"b'"'"'c'
  one_command $'tab\there' $'\t' $'cr\rx' $'\b\f\v' $'\x01\x1f\x7f' '#' '#not a comment' 'a#b'
  one_command ';' '&&' '|' '<' '>' '(' ')' '*' '?' '[a]' '{a,b}' '~' '!' '%' '^' '=' '@' '-' --x=1
  one_command python train.py --seed=1
}

@test "a command after '--': random ASCII words are the words trials.py reads back" {
  # Each command's configs line (trials_args) into one configs file, which
  # one submission's trials.py turns into commands.txt; python checks the
  # argv of both manifests (that one, and commands.txt's) against the words.
  local pool chars=() i n w word words
  pool=$' \t\r\b\f\v\x01\x7f\'"$`\\#;&|<>()*?[]{}~!%^=+@:,./-_aZ09'
  for ((i = 0; i < ${#pool}; i++)); do chars+=("${pool:i:1}"); done
  mkdir -p "$OUT"
  : >"$BATS_TEST_TMPDIR/lines.txt"
  : >"$BATS_TEST_TMPDIR/words"
  RANDOM=42
  for ((n = 0; n < 120; n++)); do
    # A program first: trials.py refuses a command without one.
    words=(prog)
    for ((w = 0; w < RANDOM % 4; w++)); do
      word=""
      for ((i = 0; i < RANDOM % 6; i++)); do word+=${chars[RANDOM % ${#chars[@]}]}; done
      words+=("$word")
    done
    opt_command=("${words[@]}")
    trials_args
    cat "$inline_configs" >>"$BATS_TEST_TMPDIR/lines.txt"
    printf '%d\0' "${#words[@]}" >>"$BATS_TEST_TMPDIR/words"
    printf '%s\0' "${words[@]}" >>"$BATS_TEST_TMPDIR/words"
  done
  opt_command=() opt_configs=$BATS_TEST_TMPDIR/lines.txt
  write_trials "$OUT"
  assert_equal "$trials_count" 120
  PYTHONPATH=$HPC_FILES_DIR "$PYTHON" -m hpc_tools.trials --configs "$OUT/commands.txt" --list >"$BATS_TEST_TMPDIR/again.jsonl"
  run "$PYTHON" - "$BATS_TEST_TMPDIR/words" "$OUT/trials.jsonl" "$BATS_TEST_TMPDIR/again.jsonl" <<'PY'
import json, sys
fields = open(sys.argv[1], "rb").read().decode().split("\0")[:-1]
for manifest in sys.argv[2:]:
    trials = [json.loads(line) for line in open(manifest)]
    i = 0
    for k, trial in enumerate(trials):
        n = int(fields[i])
        words, i = fields[i + 1 : i + 1 + n], i + 1 + n
        assert trial["argv"] == words, (manifest, k, trial["argv"], words)
    assert i == len(fields) and len(trials) == 120, (manifest, i, len(fields), len(trials))
PY
  assert_success
}

@test "a command after '--' whose first word holds '=' runs, one without a program is refused" {
  opt_command=(FOO=1 python train.py)
  rm -rf -- "$OUT"
  write_trials "$OUT"
  assert_equal "$(cat "$OUT/commands.txt")" "FOO=1 python train.py"
  opt_command=(FOO=1)
  rm -rf -- "$OUT"
  run --separate-stderr write_trials "$OUT"
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: the command after '--': only environment assignments ('FOO=1'), no program to run"
  assert_file_not_exists "$OUT/commands.txt"
  opt_command=("")
  run --separate-stderr write_trials "$OUT"
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: the command after '--': the program to run is an empty word"
}

@test "a command after '--' with non-ASCII words, or with --seeds" {
  opt_command=(python train.py 'café 😀' '日本')
  rm -rf -- "$OUT"
  write_trials "$OUT"
  assert_equal "$trials_count" 1
  assert_equal "$(cat "$OUT/trials.jsonl")" '{"argv":["python","train.py","caf\u00e9 \ud83d\ude00","\u65e5\u672c"],"params":{},"source":"configs:1","trial":0}'
  assert_equal "$(cat "$OUT/commands.txt")" "python train.py 'café 😀' '日本'"
  opt_command=(python train.py)
  opt_seeds=2
  rm -rf -- "$OUT"
  write_trials "$OUT"
  assert_equal "$trials_count" 2
  assert_equal "$(cat "$OUT/commands.txt")" $'python train.py --seed=0\npython train.py --seed=1'
  assert_equal "$(sed -n 2p "$OUT/trials.jsonl")" '{"argv":["python","train.py","--seed=1"],"params":{"seed":1},"source":"configs:1","trial":1}'
}

@test "a configs file: trials.py writes both files" {
  opt_configs="$BATS_TEST_TMPDIR/configs file.txt"
  printf '# header\n\npython train.py --lr 0.1\npython train.py --name "a b" # c\n' >"$opt_configs"
  write_trials "$OUT"
  assert_equal "$trials_count" 2
  assert_equal "$(cat "$OUT/commands.txt")" $'python train.py --lr 0.1\npython train.py --name "a b"'
  assert_equal "$(sed -n 2p "$OUT/trials.jsonl")" '{"argv":["python","train.py","--name","a b"],"params":{},"source":"configs:4","trial":1}'
  assert_equal "$(list_trials)" "$(cat "$OUT/trials.jsonl")"
}

@test "a wandb sweep id: K 'wandb agent --count 1 ID' trials, from trials.py" {
  opt_wandb_sweep=ent/proj/abc123
  plan_sweep_count=3
  write_trials "$OUT"
  assert_equal "$trials_count" 3
  assert_equal "$(cat "$OUT/commands.txt")" "$(printf 'wandb agent --count 1 ent/proj/abc123\n%.0s' 1 2 3)"
  assert_equal "$(sed -n 3p "$OUT/trials.jsonl")" '{"argv":["wandb","agent","--count","1","ent/proj/abc123"],"params":{},"source":"wandb:ent/proj/abc123","trial":2}'
  assert_equal "$(list_trials)" "$(cat "$OUT/trials.jsonl")"
}

@test "python -S for the sources that need only the standard library; site-packages for a sweep (PyYAML) and a wandb sweep" {
  opt_command=(python train.py)
  trials_py_command
  assert_equal "${trials_command[*]:0:3}" "$PYTHON -S -c"
  opt_command=() opt_configs="$BATS_TEST_TMPDIR/configs.txt" opt_seeds=2
  trials_py_command
  assert_equal "${trials_command[*]:0:3}" "$PYTHON -S -c"
  opt_seeds="" opt_sweep="$REPO_ROOT/sweeper.yml" opt_sweep_seed=0
  trials_py_command
  assert_equal "${trials_command[*]:0:2}" "$PYTHON -c"
  opt_sweep="" opt_wandb_sweep=abc plan_sweep_count=2
  trials_py_command
  assert_equal "${trials_command[*]:0:2}" "$PYTHON -c"
  # What -S leaves out is not needed: a command's trials are written.
  opt_wandb_sweep="" opt_command=(python train.py)
  rm -rf -- "$OUT" && mkdir -p "$OUT"
  write_trials "$OUT"
  assert_equal "$(cat "$OUT/commands.txt")" "python train.py"
}

@test "a check refuses while trials.py runs: stop_background ends it before the cleanup; finish_trials prints its stderr after the checks' and exits with its status" {
  local stub="$BATS_TEST_TMPDIR/python" started="$BATS_TEST_TMPDIR/started" late="$BATS_TEST_TMPDIR/late" pid
  # A trials.py that would write a file 5 s on: ended, it writes nothing.
  printf '#!/usr/bin/env bash\ntouch %q\nsleep 5\ntouch %q\n' "$started" "$late" >"$stub"
  chmod +x "$stub"
  HPC_PYTHON=$stub
  opt_command=(python train.py)
  start_trials "$OUT"
  # Ended once it runs: a subshell ended before its exec runs the EXIT and
  # ERR traps it inherited, here bats' own, which report the test failed.
  local deadline=$((SECONDS + 60))
  until [[ -f "$started" ]]; do
    ((SECONDS < deadline)) || fail "the stub trials.py did not start within 60 s"
    sleep 0.02
  done
  stop_background
  assert_equal "${background_pid_trials:-}" ""
  assert_file_not_exists "$late"
  # One that has ended already (bash reaped it): nothing to stop, no failure
  # (the EXIT trap runs under set -e, and the cleanup comes after it).
  printf '#!/usr/bin/env bash\nexit 0\n' >"$stub"
  start_trials "$OUT"
  pid=$background_pid_trials
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  stop_background
  printf '#!/usr/bin/env bash\necho "job_submitter.sh: error: refused" >&2\nexit 2\n' >"$stub"
  run --separate-stderr bash -c "$(declare -f start_trials run_trials_py finish_trials trials_py_command trials_args shell_quote login_python require_runnable error_line one_line hpc_tools_path register_cleanup make_work_dir start_background await await_or_exit die); TRIALS_PY_MAIN=x; HPC_BACKGROUND=(); $(declare -p TRIALS_PYTHON_REFUSAL); $(declare -p HPC_PYTHON OUT); HPC_FILES_DIR=x HPC_PROG=job_submitter.sh opt_command=(python train.py); start_trials \"\$OUT\"; echo 'job_submitter.sh: --after-running: queued' >&2; finish_trials; echo unreached"
  assert_failure 2
  assert_equal "$stderr" $'job_submitter.sh: --after-running: queued\njob_submitter.sh: error: refused'
  assert_output ''
}
