#!/usr/bin/env bats
# --setup-venv with a stubbed sbatch: the setup job gets the site's modules,
# environment and sbatch lines, --sbatch-arg and the job's CPUs and wall time;
# a training job sbatch refuses takes its setup job with it. No cluster.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  # sbatch: prints job ids 100, 101, ...; refuses call number $STUB_SBATCH_REFUSE_CALL.
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  mkdir -p "$bin"
  cat >"$bin/sbatch" <<'STUB'
#!/usr/bin/env bash
calls=$(($(cat "$STUB_SBATCH_LOG.calls" 2>/dev/null || echo 0) + 1))
echo "$calls" >"$STUB_SBATCH_LOG.calls"
printf '%s\n' "$@" -- >>"$STUB_SBATCH_LOG"
cp "${@: -1}" "$STUB_SBATCH_LOG.script$calls"
if [[ "$calls" == "${STUB_SBATCH_REFUSE_CALL:-0}" ]]; then
  echo "sbatch: error: Batch job submission failed: Invalid qos specification" >&2
  exit 1
fi
echo $((99 + calls))
STUB
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$@" >>"%s"\n' "$BATS_TEST_TMPDIR/scancel.log" >"$bin/scancel"
  chmod +x "$bin/sbatch" "$bin/scancel"
  printf 'numpy\n' >"$BATS_TEST_TMPDIR/requirements.txt"
  cat >"$BATS_TEST_TMPDIR/site.conf" <<'CONF'
account = def-lab
modules = python/3.11 cuda/12.2
env = PIP_INDEX_URL=https://mirror.example/simple
sbatch = --qos=normal
command = echo site-command
CONF
}

@test "the setup job gets the site's modules, env, sbatch lines, --sbatch-arg, the job's CPUs and wall time" {
  run --separate-stderr "$SUBMITTER" --site "$BATS_TEST_TMPDIR/site.conf" -g 2 -c 3 -W torchrun -t 02:30:00 \
    --sbatch-arg=--reservation=r1 --venv "$BATS_TEST_TMPDIR/venv" --setup-venv "$BATS_TEST_TMPDIR/requirements.txt" \
    -C "$ONE_LINE" </dev/null
  assert_success
  local script="$STUB_SBATCH_LOG.script1"
  assert_file_exists "$script"
  grep -qx '#SBATCH --job-name=.*_setup_venv' "$script"
  grep -qx '#SBATCH --account=def-lab' "$script"
  grep -qx '#SBATCH --qos=normal' "$script"
  grep -qx '#SBATCH --reservation=r1' "$script"
  grep -qx '#SBATCH --cpus-per-task=6' "$script"
  grep -qx '#SBATCH --time=02:30:00' "$script"
  grep -qx 'module load python/3.11 cuda/12.2 .*' "$script"
  grep -qx 'export PIP_INDEX_URL=https://mirror.example/simple' "$script"
  grep -qx 'echo site-command' "$script"
  grep -qx "export HPC_VENV=$BATS_TEST_TMPDIR/venv" "$script"
  grep -q 'exec bash "$HPC_SUBMISSION_DIR/node/setup_venv.sh"' "$script"
  # The training job waits for it.
  grep -qx -- '--dependency=afterok:100' "$STUB_SBATCH_LOG"
}

@test "sbatch refusing the training job cancels the setup job already queued, and the folder goes" {
  STUB_SBATCH_REFUSE_CALL=2 run --separate-stderr "$SUBMITTER" -g 0 -W none -e refused --venv "$BATS_TEST_TMPDIR/venv" \
    --setup-venv "$BATS_TEST_TMPDIR/requirements.txt" -C "$ONE_LINE" </dev/null
  assert_failure 1
  [[ "$stderr" == *"sbatch refused the job: sbatch: error: Batch job submission failed: Invalid qos specification"* ]] ||
    fail "stderr: $stderr"
  assert_equal "$(cat "$BATS_TEST_TMPDIR/scancel.log")" 100
  assert_equal "$(submission_dirs refused)" ""
}

@test "the training job records the requirements digest it expects in its venv: its own --setup-venv's, else the one the venv holds" {
  local digest venv="$BATS_TEST_TMPDIR/venv"
  digest=$(sha256sum <"$BATS_TEST_TMPDIR/requirements.txt" | cut -d' ' -f1)
  run --separate-stderr "$SUBMITTER" --venv "$venv" --setup-venv "$BATS_TEST_TMPDIR/requirements.txt" -C "$ONE_LINE" </dev/null
  assert_success
  grep -qx "export HPC_VENV_DIGEST=$digest" "$STUB_SBATCH_LOG.script2"
  # A later plain submission with that venv set up: the digest it holds now.
  mkdir -p "$venv/bin"
  ln -s "$(command -v python3)" "$venv/bin/python"
  echo feedbeef >"$venv/.hpc-requirements.sha256"
  run --separate-stderr "$SUBMITTER" --venv "$venv" -C "$ONE_LINE" </dev/null
  assert_success
  grep -qx "export HPC_VENV_DIGEST=feedbeef" "$STUB_SBATCH_LOG.script3"
  # A venv never set up by --setup-venv: nothing to check.
  rm "$venv/.hpc-requirements.sha256"
  run --separate-stderr "$SUBMITTER" --venv "$venv" -C "$ONE_LINE" </dev/null
  assert_success
  run grep -c HPC_VENV_DIGEST "$STUB_SBATCH_LOG.script4"
  assert_output 0
}

@test "compute_internet = no: the setup script runs here, before the job is queued, and the job has no dependency" {
  printf 'compute_internet = no\n' >>"$BATS_TEST_TMPDIR/site.conf"
  # A setup python whose venv's pip records what it was asked to install.
  local bin="$BATS_TEST_TMPDIR/setup-python"
  mkdir -p "$bin"
  cat >"$bin/python3" <<'STUB'
#!/usr/bin/env bash
venv=${*: -1}
mkdir -p "$venv/bin"
cat >"$venv/bin/python" <<'PIP'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"${0%/bin/python}/pip.log"
PIP
chmod +x "$venv/bin/python"
STUB
  chmod +x "$bin/python3"
  # Lmod defines 'module' for non-interactive shells through BASH_ENV.
  printf 'module() { printf "%%s\\n" "$*" >>"%s"; }\n' "$BATS_TEST_TMPDIR/module.log" >"$BATS_TEST_TMPDIR/lmod.bash"
  run --separate-stderr env HPC_SETUP_PYTHON="$bin/python3" BASH_ENV="$BATS_TEST_TMPDIR/lmod.bash" "$SUBMITTER" --site "$BATS_TEST_TMPDIR/site.conf" -g 0 -W none \
    --venv "$BATS_TEST_TMPDIR/venv" --setup-venv "$BATS_TEST_TMPDIR/requirements.txt" -C "$ONE_LINE" </dev/null
  ((status == 0)) || fail "exit $status: $stderr"
  assert_equal "$(cat "$STUB_SBATCH_LOG.calls")" 1
  ! grep -q -- '--dependency' "$STUB_SBATCH_LOG" || fail "the job waits for a setup job: $(cat "$STUB_SBATCH_LOG")"
  grep -q -- '-m pip install -r .*/requirements.txt' "$BATS_TEST_TMPDIR/venv/pip.log"
  assert_file_exists "$BATS_TEST_TMPDIR/venv/.hpc-requirements.sha256"
  assert_equal "$(cat "$BATS_TEST_TMPDIR/module.log")" "load python/3.11 cuda/12.2"
  [[ "$stderr" == *"compute nodes have no internet; building $BATS_TEST_TMPDIR/venv here"* ]] || fail "$stderr"
}
