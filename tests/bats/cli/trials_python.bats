#!/usr/bin/env bats
# The python that expands trials on the login node (HPC_PYTHON, the venv's, or
# python3) must be 3.9 or newer; an older one (CentOS 7's 3.6) is refused
# with one line, before it can print a traceback.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  old="$BATS_TEST_TMPDIR/old python/python3.6"
  mkdir -p "${old%/*}"
  fake_python_version "$old" 3 6 8
}

# fake_python_version FILE MAJOR MINOR MICRO: a python at FILE whose
# sys.version_info says MAJOR.MINOR.MICRO; it runs the submitter's
# 'python [-S] -c PROGRAM ARG...' with the usual python, so the version
# check runs as it would on that python.
fake_python_version() {
  cat >"$1" <<STUB
#!/usr/bin/env bash
[[ "\$1" != -S ]] || shift
[[ "\$1" == -c ]] || { echo "fake python: expected -c PROGRAM" >&2; exit 2; }
shift
exec $(printf %q "${HPC_PYTHON:-python3}") -c 'import sys; sys.version_info = ($2, $3, $4, "final", 0); program = sys.argv.pop(1); exec(program)' "\$@"
STUB
  chmod +x "$1"
}

@test "an old python is refused with one line naming it and its version" {
  local message="job_submitter.sh: error: expanding trials needs python 3.9 or newer; $old is 3.6.8 (set HPC_PYTHON to a newer python, or pass --venv)"
  # (--dry-run counts trials in a subshell whose failure job_submitter.sh
  # does not check yet; --list-trials and a real submission do.)
  HPC_PYTHON=$old run --separate-stderr "$SUBMITTER" --list-trials --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_failure 1
  assert_output ''
  assert_equal "$stderr" "$message"
  HPC_PYTHON=$old run --separate-stderr "$SUBMITTER" --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_failure 1
  assert_output ''
  assert_equal "$stderr" "$message"
  assert_file_not_exists "$STUB_SBATCH_LOG"
}

@test "a missing HPC_PYTHON is refused with one line" {
  HPC_PYTHON="$BATS_TEST_TMPDIR/no such python" run --separate-stderr "$SUBMITTER" --list-trials --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_failure 1
  assert_equal "$stderr" "job_submitter.sh: error: expanding trials needs python 3.9 or newer; cannot run '$BATS_TEST_TMPDIR/no such python' (set HPC_PYTHON to a newer python, or pass --venv)"
}

@test "a python whose minor version has two digits (3.10) counts as newer than 3.9" {
  local newer="$BATS_TEST_TMPDIR/newer python/python3.10"
  mkdir -p "${newer%/*}"
  fake_python_version "$newer" 3 10 1
  HPC_PYTHON=$newer run --separate-stderr "$SUBMITTER" --list-trials --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_success
  [[ -n "$output" ]] || fail "no trials listed"
}

@test "the usual python still expands a sweep" {
  run --separate-stderr "$SUBMITTER" --list-trials --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_success
}

@test "a project holding hpc_files/ without hpc_harness/ expands any configs file and a sweep" {
  # README: hpc_harness/ is optional; the submitter's own python must travel
  # with hpc_files/.
  local project="$BATS_TEST_TMPDIR/user project"
  mkdir -p "$project"
  cp -r "$REPO_ROOT/hpc_files" "$REPO_ROOT/virtual_env_hpc_files" "$REPO_ROOT/singularity_hpc_files" "$project/"
  # Quotes need parsing: not a plain line.
  printf '%s\n' "python train.py --name 'a b'" >"$project/configs.txt"
  run --separate-stderr "$project/hpc_files/job_submitter.sh" --list-trials --configs "$project/configs.txt"
  assert_success
  assert_output '{"argv":["python","train.py","--name","a b"],"params":{},"source":"configs:1","trial":0}'
  run --separate-stderr "$project/hpc_files/job_submitter.sh" --list-trials --sweep "$FIXTURES/sweeps/grid_probe.yml"
  assert_success
  [[ -n "$output" ]] || fail "no trials listed"
}
