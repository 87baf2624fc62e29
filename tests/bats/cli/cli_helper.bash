# shellcheck shell=bash disable=SC2034,SC2154 # PROJECT, ONE_LINE, project, ... are read by the .bats files; status, output and stderr are set by bats' run
# Shared by tests/bats/cli/*.bats: `load 'cli_helper'` after '../test_helper'.
# A clean environment for job_submitter.sh (private HOME, no HPC_* knobs,
# SCRATCH with a space in its path, sbatch stubbed), `refuse`, the check
# every refused invocation goes through, and the fabricated submissions that
# status.sh and results.sh read.

# cli_setup: what every CLI test starts with.
cli_setup() {
  make_scratch
  SCRATCH_ROOT=$SCRATCH
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  unset HPC_SITE HPC_SITES_DIR
  # trials.py runs with the project's python (PyYAML for --sweep).
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    export HPC_PYTHON="$REPO_ROOT/.venv/bin/python"
  else
    export HPC_PYTHON=python3
  fi
  PROJECT=${REPO_ROOT##*/}
  ONE_LINE="$FIXTURES/configs/one_line.txt"
  THREE_LINES="$FIXTURES/configs/three_lines.txt"
  FAKE_VENV="$FIXTURES/fake_venv"
  DUMMY_SIF="$FIXTURES/containers/dummy.sif"
  stub_sbatch
}

# scratch_listing: every path under the scratch folder with its type and size.
scratch_listing() {
  (cd "$SCRATCH_ROOT" && find . -printf '%p %y %s\n' | LC_ALL=C sort)
}

# refuse EXPECTED -- ARG...: job_submitter.sh ARG... (stdin /dev/null) is
# refused as a usage error: it ends with exit 2, prints nothing on stdout and
# exactly one stderr line 'job_submitter.sh: error: ...' that contains
# EXPECTED; sbatch was not called and nothing appeared under the scratch
# folder. The 120 s bound is a hang guard (a parsing loop), not a measure.
refuse() {
  local expected=$1 before after
  [[ "${2:-}" == -- ]] || fail "usage: refuse EXPECTED -- ARG..."
  shift 2
  before=$(scratch_listing)
  run --separate-stderr timeout 120 "$SUBMITTER" "$@" </dev/null
  after=$(scratch_listing)
  ((status != 124)) || fail "job_submitter.sh did not finish within 120 s (a parsing loop?)"
  ((status == 2)) || fail "expected exit 2, got $status; stderr: $stderr; stdout: $(head -c 300 <<<"$output")"
  [[ -z "$output" ]] || fail "expected nothing on stdout, got: $(head -c 300 <<<"$output")"
  [[ -n "$stderr" && "$stderr" != *$'\n'* ]] || fail "expected exactly one line on stderr, got: $stderr"
  [[ "$stderr" == "job_submitter.sh: error: "* ]] || fail "stderr does not start with 'job_submitter.sh: error: ': $stderr"
  [[ "$stderr" == *"$expected"* ]] || fail "stderr does not name the problem ('$expected'): $stderr"
  [[ ! -e "$STUB_SBATCH_LOG" ]] || fail "sbatch was called: $(cat "$STUB_SBATCH_LOG")"
  [[ "$before" == "$after" ]] || fail "files appeared under SCRATCH: $(diff <(printf '%s\n' "$before") <(printf '%s\n' "$after"))"
}

# dry ARG...: job_submitter.sh --dry-run ARG...; must succeed with nothing on
# stderr. Sets output/lines as `run` does.
dry() {
  run --separate-stderr "$SUBMITTER" --dry-run "$@" </dev/null
  ((status == 0)) || fail "job_submitter.sh --dry-run $* exited $status: $stderr"
  [[ -z "$stderr" ]] || fail "unexpected stderr: $stderr"
}

# stub_sbatch_recording: like stub_sbatch (argv to $STUB_SBATCH_LOG, prints 4242),
# and also records the folder it ran in and HPC_SUBMISSION_DIR
# ($STUB_SBATCH_LOG.where) and its whole environment ($STUB_SBATCH_LOG.env). With
# STUB_SBATCH_FAIL set, it prints that on stderr and exits 1 instead.
stub_sbatch_recording() {
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  stub_sbatch
  cat >"$bin/sbatch" <<'STUB'
#!/usr/bin/env bash
for arg in "$@"; do printf '%s\n' "$arg" >>"$STUB_SBATCH_LOG"; done
echo "--" >>"$STUB_SBATCH_LOG"
printf '%s\n%s\n' "$PWD" "${HPC_SUBMISSION_DIR:-}" >>"$STUB_SBATCH_LOG.where"
env >>"$STUB_SBATCH_LOG.env"
if [[ -n "${STUB_SBATCH_FAIL:-}" ]]; then
  printf '%s\n' "$STUB_SBATCH_FAIL" >&2
  exit 1
fi
echo "4242"
STUB
  chmod +x "$bin/sbatch"
}

# submission_dirs EXP: the submission folders of experiment EXP, one a line.
submission_dirs() {
  find "$SCRATCH/$PROJECT/$1" -mindepth 1 -maxdepth 1 -type d ! -name checkpoints 2>/dev/null | LC_ALL=C sort
}

# fabricated_submissions: SCRATCH holding the submission folders, logs and
# metrics.csv files that fixtures/results/fabricate.py writes for $project,
# and an scontrol and an sacct on PATH for which SLURM has forgotten their
# jobs (the real ones would ask the local cluster, whose job 500 may be
# another suite's). Each logs its calls, in $SCONTROL_LOG and $SACCT_LOG;
# scontrol fails as SLURM does, unless a test writes what it answers into
# $SCONTROL_OUT; sacct is stub_sbatch's (it keeps no job).
fabricated_submissions() {
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  make_scratch
  project=${REPO_ROOT##*/}
  "$REPO_ROOT/.venv/bin/python" "$FIXTURES/results/fabricate.py" "$SCRATCH" "$project"
  mkdir -p "$bin"
  export SCONTROL_LOG="$BATS_TEST_TMPDIR/scontrol.log" \
    SCONTROL_OUT="$BATS_TEST_TMPDIR/scontrol.out" SACCT_LOG="$BATS_TEST_TMPDIR/sacct.log"
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$SCONTROL_LOG"
if [[ -f "$SCONTROL_OUT" ]]; then cat "$SCONTROL_OUT"; exit 0; fi
echo "slurm_load_jobs error: Invalid job id specified" >&2
exit 1
STUB
  ln -s "$FIXTURES/stub-bin/sacct" "$bin/sacct"
  chmod +x "$bin/scontrol"
  export PATH="$bin:$PATH"
}
