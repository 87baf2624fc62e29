#!/usr/bin/env bats
# hpc_files/lib/trials.sh: trials_in_bash, the manifest written without python
# for a command after '--' and for plain configs files, against trials.py
# itself. Where the fast path applies, trials.jsonl and commands.txt must be
# the bytes trials.py writes; everywhere else it must decline (return 1), so
# that trials.py decides.

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
  opt_command=()
  opt_seeds="" opt_configs="" opt_sweep="" opt_wandb_sweep=""
  HPC_CLEANUP_PATHS=()
  BASH_OUT="$BATS_TEST_TMPDIR/bash"
  PY_OUT="$BATS_TEST_TMPDIR/python"
}

teardown() {
  run_cleanup
}

# python_manifest: trials.py on the current opt_* into $PY_OUT, exactly as
# write_trials calls it when the fast path declines.
python_manifest() {
  rm -rf -- "$PY_OUT"
  trials_args
  "$PYTHON" "$HPC_FILES_DIR/lib/trials.py" "${trials_argv[@]}" --out-dir "$PY_OUT" >/dev/null
}

# same_as_python: trials_in_bash takes the current opt_* and writes what
# trials.py writes, byte for byte.
same_as_python() {
  trials_in_bash || fail "the fast path declined: ${opt_command[*]:-$opt_configs}"
  mkdir -p "$BASH_OUT"
  printf '%s\n' "${trials_jsonl[@]}" >"$BASH_OUT/trials.jsonl"
  printf '%s\n' "${trials_commands[@]}" >"$BASH_OUT/commands.txt"
  python_manifest || fail "trials.py refused what the fast path accepted: ${opt_command[*]:-$opt_configs}"
  cmp "$PY_OUT/trials.jsonl" "$BASH_OUT/trials.jsonl" ||
    fail "trials.jsonl differs: $(diff "$PY_OUT/trials.jsonl" "$BASH_OUT/trials.jsonl")"
  cmp "$PY_OUT/commands.txt" "$BASH_OUT/commands.txt" ||
    fail "commands.txt differs: $(diff "$PY_OUT/commands.txt" "$BASH_OUT/commands.txt")"
}

# command_same_as_python WORD...: with and without --seeds 3.
command_same_as_python() {
  opt_command=("$@")
  opt_seeds=""
  same_as_python
  opt_seeds=3
  same_as_python
}

# configs_same_as_python TEXT [SEEDS]: a configs file holding TEXT, without
# --seeds, and with --seeds SEEDS (default 2; 0: not).
configs_same_as_python() {
  opt_configs="$BATS_TEST_TMPDIR/configs file.txt"
  printf '%s' "$1" >"$opt_configs"
  opt_seeds=""
  same_as_python
  [[ "${2:-2}" != 0 ]] || return 0
  opt_seeds=${2:-2}
  same_as_python
}

# configs_declined TEXT: the fast path leaves a configs file holding TEXT to trials.py.
configs_declined() {
  opt_configs="$BATS_TEST_TMPDIR/configs file.txt"
  printf '%s' "$1" >"$opt_configs"
  ! trials_in_bash || fail "the fast path took a configs file it must leave to trials.py: $(printf '%q' "$1")"
}

@test "a command after '--': tricky ASCII words give trials.py's bytes" {
  command_same_as_python python train.py --lr 0.1
  command_same_as_python python train.py 'two words' "it's" '' ' '
  command_same_as_python python -c 'print("hi")' "\$HOME" '${x}' "\$(touch pwned)" '`touch pwned`'
  command_same_as_python a\\b 'c\' '\\' '"' "'" "\"'\"" 'a"b'"'"'c'
  command_same_as_python $'tab\there' $'\t' $'cr\rx' $'\b\f\v' $'\x01\x1f\x7f' '#' '#not a comment' 'a#b'
  command_same_as_python ';' '&&' '|' '<' '>' '(' ')' '*' '?' '[a]' '{a,b}' '~' '!' '%' '^' '=' '@' '-' --x=1
  command_same_as_python --seedling --seeds=2 seed=3
}

@test "a command after '--': random ASCII words give trials.py's argv and command" {
  # One trials.py run for many commands: the inline configs lines, one per
  # command, against the fast path's argv and command for each.
  local pool chars=() i n w word words quoted_lines=() want_argv=() want_cmd=() line
  pool=$' \t\r\b\f\v\x01\x7f\'"$`\\#;&|<>()*?[]{}~!%^=+@:,./-_aZ09'
  for ((i = 0; i < ${#pool}; i++)); do chars+=("${pool:i:1}"); done
  RANDOM=42
  for ((n = 0; n < 120; n++)); do
    words=()
    for ((w = 0; w <= RANDOM % 4; w++)); do
      word=""
      for ((i = 0; i < RANDOM % 6; i++)); do word+=${chars[RANDOM % ${#chars[@]}]}; done
      words+=("$word")
    done
    opt_command=("${words[@]}")
    trials_in_bash || fail "the fast path declined ASCII words: $(printf '%q ' "${words[@]}")"
    line=${trials_jsonl[0]#*\"argv\":}
    want_argv+=("${line%%,\"params\":*}")
    want_cmd+=("${trials_commands[0]}")
    quoted_lines+=("$(shell_quote "${words[@]}")")
  done
  opt_command=()
  opt_configs="$BATS_TEST_TMPDIR/many.txt"
  printf '%s\n' "${quoted_lines[@]}" >"$opt_configs"
  python_manifest
  mapfile -t got_json <"$PY_OUT/trials.jsonl"
  mapfile -t got_cmd <"$PY_OUT/commands.txt"
  assert_equal "${#got_json[@]}" 120
  for ((n = 0; n < 120; n++)); do
    line=${got_json[n]#*\"argv\":}
    [[ "${line%%,\"params\":*}" == "${want_argv[n]}" ]] ||
      fail "argv of command $n: trials.py ${line%%,\"params\":*}, fast path ${want_argv[n]}"
    [[ "${got_cmd[n]}" == "${want_cmd[n]}" ]] ||
      fail "command $n: trials.py ${got_cmd[n]}, fast path ${want_cmd[n]}"
  done
}

@test "a command after '--': non-ASCII, invalid UTF-8 or a --seed under --seeds goes to trials.py" {
  local words
  for words in 'café' '日本' $'\xff' $'\xc3' '😀' $'nbsp\xc2\xa0'; do
    opt_command=(python train.py "$words")
    ! trials_in_bash || fail "the fast path took non-ASCII $(printf '%q' "$words")"
  done
  opt_command=(python train.py --seed 1)
  opt_seeds=2
  ! trials_in_bash || fail "the fast path took --seed with --seeds"
  opt_command=(python train.py --seed=1)
  ! trials_in_bash || fail "the fast path took --seed= with --seeds"
  opt_seeds=1001
  opt_command=(python train.py)
  ! trials_in_bash || fail "the fast path took more than 1000 trials"
  opt_seeds=""
  opt_command=(python train.py --seed=1)
  trials_in_bash || fail "without --seeds, --seed is just a word"
  # And what trials.py makes of them is what write_trials writes.
  opt_command=(python train.py 'café 😀' '日本')
  write_trials "$BATS_TEST_TMPDIR/w" >/dev/null
  python_manifest
  cmp "$PY_OUT/trials.jsonl" "$BATS_TEST_TMPDIR/w/trials.jsonl"
  cmp "$PY_OUT/commands.txt" "$BATS_TEST_TMPDIR/w/commands.txt"
  assert_equal "$trials_count" 1
}

@test "a plain configs file gives trials.py's bytes" {
  configs_same_as_python $'python train.py --lr 0.1\n'
  configs_same_as_python $'# header\n\npython train.py --lr 0.1\npython train.py --lr 0.01 --layers 2\n\n# end\n'
  configs_same_as_python $'  python  train.py\t--lr=0.1   # comment "with quotes" $x \\\n\tpython -m pkg.mod a#b #c\n'
  configs_same_as_python $'python a\r\npython b\r\n\r\n# c\r\n'
  configs_same_as_python $'no-final-newline x=1,y=2 a:b @c %d ^e +f'
  configs_same_as_python $'  # indented comment\n\v\f\x1c\n#!/bin/bash \'\\\n x #\n'
  configs_same_as_python $'# comments may hold anything ASCII: \' " \\ $ ; ( ) \x01\n--seedling 1\n'
}

@test "a configs file that needs parsing goes to trials.py" {
  configs_declined $'python train.py --name "two words"\n'
  configs_declined $'python train.py --name \'one\'\n'
  configs_declined $'python train.py \\\n  --lr 0.1\n'
  configs_declined $'python train.py --dir "$SLURM_TMPDIR/x"\n'
  configs_declined $'python train.py --dir $HOME\n'
  configs_declined $'python train.py a;b\n'
  configs_declined $'python train.py *.txt\n'
  configs_declined $'python train.py --x=\xc3\xa9\n'
  configs_declined $'# caf\xc3\xa9\npython train.py\n'
  configs_declined $'python\vtrain.py\n'
  configs_declined $'python train.py\r\r\n'
  printf 'python train.py\0 x\n' >"$opt_configs" # a NUL byte
  ! trials_in_bash || fail "the fast path took a file with a NUL byte"
  configs_declined $'# nothing\n\n'
  # Long files and large manifests: python is faster there.
  configs_declined "$(printf 'python train.py --i %s\n' {1..201})"
  opt_seeds=500
  configs_declined $'python a\npython b\npython c\n'
  opt_seeds=""
  configs_declined ''
  opt_seeds=2
  configs_declined $'python train.py --seed 3\n'
  configs_declined $'python train.py --seed=3\n'
}

@test "random plain configs files give trials.py's bytes" {
  local pool chars=() i f l text
  pool=$'aZ09_./:=,+@%^-#    \t\t'
  for ((i = 0; i < ${#pool}; i++)); do chars+=("${pool:i:1}"); done
  RANDOM=7
  for ((f = 0; f < 8; f++)); do
    text=""
    for ((l = 0; l < 8; l++)); do
      case $((RANDOM % 6)) in
        0) text+=$'\n' ;;
        1) text+=$'  # a comment: \' " \\ $\n' ;;
        *)
          text+=p
          for ((i = 0; i < RANDOM % 20; i++)); do text+=${chars[RANDOM % ${#chars[@]}]}; done
          ((RANDOM % 3)) || text+=$'\r'
          text+=$'\n'
          ;;
      esac
    done
    configs_same_as_python "$text" $((f % 2 ? 0 : 3))
  done
}

@test "sweeps and wandb sweeps never take the fast path" {
  opt_sweep="$FIXTURES/sweeps/grid.yml"
  ! trials_in_bash || fail "the fast path took --sweep"
  opt_sweep=""
  opt_wandb_sweep=abc
  ! trials_in_bash || fail "the fast path took -w"
}
