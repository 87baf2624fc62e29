#!/usr/bin/env bats
# hpc_files/lib/common.sh: messages, quoting and number helpers.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"

# round_trip WORD...: shell_quote's output, read back by the shell, is the same words.
round_trip() {
  local quoted
  quoted=$(shell_quote "$@")
  local -a want=("$@")
  eval "set -- $quoted"
  assert_equal "$#" "${#want[@]}"
  local i=0 word
  for word in "$@"; do
    [[ "$word" == "${want[i]}" ]] || fail "word $i came back as '$word', expected '${want[i]}' (quoted: $quoted)"
    i=$((i + 1))
  done
}

@test "shell_quote round-trips hostile words through eval" {
  round_trip '$(touch x)' '`touch x`' "it's" '"double"' 'a b' $'new\nline' $'tab\there' \
    '*' '?' '~' '~root' '-n' '--' '' ' ' 'a;b' 'c,d' '|&<>' '\' '\\n' '!' '$HOME' '${x:-y}' \
    "'" "''" $'\xff\xfe' 'é' '#comment' 'x=1' '{a,b}' '[ab]'
}

@test "shell_quote round-trips each hostile word alone" {
  local word
  for word in '$(touch x)' "it's" $'new\nline' '' "'" '\' '*'; do
    round_trip "$word"
  done
}

@test "shell_quote leaves plain words readable and quotes the rest with single quotes" {
  run shell_quote python train.py --lr=0.1 a/b.c:d@e%f+g^h,i
  assert_output "python train.py --lr=0.1 a/b.c:d@e%f+g^h,i"
  run shell_quote 'two words' "it's" ''
  assert_output "'two words' 'it'\\''s' ''"
}

@test "shell_quote runs nothing it quotes" {
  local quoted
  quoted=$(shell_quote "\$(touch $BATS_TEST_TMPDIR/pwned)" "\`touch $BATS_TEST_TMPDIR/pwned\`")
  eval "set -- $quoted"
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}

@test "one_line shows newlines, carriage returns and tabs escaped" {
  run one_line $'a\nb\rc\td'
  assert_output 'a\nb\rc\td'
}

@test "usage_error: one line on stderr, exit 2" {
  run --separate-stderr usage_error $'bad\nvalue'
  assert_failure 2
  assert_equal "$output" ""
  assert_equal "$stderr" 'job_submitter.sh: error: bad\nvalue'
}

@test "die: one line on stderr, exit 1" {
  run --separate-stderr die "tar failed"
  assert_failure 1
  assert_equal "$stderr" "job_submitter.sh: error: tar failed"
}

@test "is_uint" {
  local v
  for v in 0 1 007 123456789; do
    is_uint "$v" || fail "is_uint '$v' failed"
  done
  for v in '' -1 +1 1.5 ' 1' '1 ' x 0x10 1e3; do
    ! is_uint "$v" || fail "is_uint '$v' succeeded"
  done
}

@test "run_cleanup removes registered paths, even with spaces" {
  mkdir -p "$BATS_TEST_TMPDIR/a b/c"
  touch "$BATS_TEST_TMPDIR/f"
  register_cleanup "$BATS_TEST_TMPDIR/a b"
  register_cleanup "$BATS_TEST_TMPDIR/f"
  run_cleanup
  assert_not_exists "$BATS_TEST_TMPDIR/a b"
  assert_not_exists "$BATS_TEST_TMPDIR/f"
}

@test "login_python: HPC_PYTHON, else the --venv's python, else the project's .venv, else python3" {
  local venv="$BATS_TEST_TMPDIR/a venv" project="$BATS_TEST_TMPDIR/a project"
  mkdir -p "$venv/bin" "$project/.venv/bin"
  printf '#!/bin/sh\n' | tee "$venv/bin/python" >"$project/.venv/bin/python"
  chmod +x "$venv/bin/python" "$project/.venv/bin/python"
  source_dir=$project
  HPC_PYTHON=/x/python opt_venv=$venv run login_python
  assert_output /x/python
  HPC_PYTHON="" opt_venv=$venv run login_python
  assert_output "$venv/bin/python"
  HPC_PYTHON="" opt_venv="" run login_python
  assert_output "$project/.venv/bin/python"
  source_dir="$BATS_TEST_TMPDIR/elsewhere"
  HPC_PYTHON="" opt_venv="" run login_python
  assert_output python3
}
