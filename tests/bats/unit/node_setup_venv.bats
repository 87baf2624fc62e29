#!/usr/bin/env bats
# hpc_files/node/setup_venv.sh (the --setup-venv job) run directly, with a
# fake python that "creates" the venv: its bin/python logs the pip calls and
# fails 'install -r' when FAKE_PIP_FAIL is set. The submit side (when the
# job is submitted at all) is in ../cli/setup_venv.bats.

load '../test_helper'

SETUP="$REPO_ROOT/hpc_files/node/setup_venv.sh"

setup() {
  export PIP_LOG="$BATS_TEST_TMPDIR/pip.log"
  local fake="$BATS_TEST_TMPDIR/fake python3"
  # '-m venv DIR': DIR/bin/python, which logs its argv.
  cat >"$fake" <<'STUB'
#!/usr/bin/env bash
[[ "$1 $2" == "-m venv" ]] || exit 1
mkdir -p "$3/bin"
cat >"$3/bin/python" <<'PY'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$PIP_LOG"
[[ -z "${FAKE_PIP_FAIL:-}" || "$*" != *" -r "* ]] || exit 1
PY
chmod +x "$3/bin/python"
STUB
  chmod +x "$fake"
  export HPC_SETUP_PYTHON=$fake
  export HPC_VENV="$BATS_TEST_TMPDIR/venvs/my env"
  export HPC_REQUIREMENTS="$BATS_TEST_TMPDIR/requirements.txt"
  export HPC_REQUIREMENTS_DIGEST=abc123
  printf 'numpy\n' >"$HPC_REQUIREMENTS"
  unset FAKE_PIP_FAIL
}

@test "creates the venv, installs the requirements, then stamps their digest" {
  run --separate-stderr "$SETUP"
  assert_success
  assert_equal "${lines[-1]:0:$((${#HPC_VENV} + 16))}" "hpc: $HPC_VENV is ready ("
  assert_equal "$(cat "$PIP_LOG")" "-m pip install --upgrade pip
-m pip install -r $HPC_REQUIREMENTS"
  assert_equal "$(cat "$HPC_VENV/.hpc-requirements.sha256")" abc123
}

@test "a venv already stamped with this digest: nothing is installed" {
  "$SETUP" >/dev/null
  : >"$PIP_LOG"
  run --separate-stderr "$SETUP"
  assert_success
  assert_line "hpc: $HPC_VENV already matches these requirements; nothing to do"
  assert_equal "$(cat "$PIP_LOG")" ""
}

@test "other requirements: the existing venv is updated, not recreated, and restamped" {
  "$SETUP" >/dev/null
  printf 'keep\n' >"$HPC_VENV/bin/marker"
  HPC_REQUIREMENTS_DIGEST=def456 run --separate-stderr "$SETUP"
  assert_success
  assert_file_exists "$HPC_VENV/bin/marker"
  assert_equal "$(cat "$HPC_VENV/.hpc-requirements.sha256")" def456
}

@test "a failed install fails the job and leaves no stamp (the old one is gone too)" {
  "$SETUP" >/dev/null
  FAKE_PIP_FAIL=1 HPC_REQUIREMENTS_DIGEST=def456 run --separate-stderr "$SETUP"
  assert_failure
  assert_not_exist "$HPC_VENV/.hpc-requirements.sha256"
}
