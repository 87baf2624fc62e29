#!/usr/bin/env bats
# bench/trace_submit.sh: the submitter run unchanged, with a timestamped line
# per step of its main(). The submitter has no tracing of its own.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  stub_sbatch_recording
  # The tracer's clock is bash 5's (the 4.2 run has none).
  bash -c 'exit $((BASH_VERSINFO[0] < 5))' || skip "the tracer needs bash 5 on PATH"
  TRACER="$REPO_ROOT/bench/trace_submit.sh"
}

@test "trace_submit.sh: a submission as usual, and one timestamped line per step of main(), none for nested calls" {
  mkdir -p "$BATS_TEST_TMPDIR/trace dir"
  run --separate-stderr timeout 60 bash "$TRACER" "$BATS_TEST_TMPDIR/trace dir/trace.tsv" "$SUBMITTER" -e traced -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
  assert_line --index 0 --partial "Submitted job 4242"
  run cut -f2 "$BATS_TEST_TMPDIR/trace dir/trace.tsv"
  assert_line --index 0 'main "$@"'
  assert_line 'parse_options "$@"'
  assert_line 'load_site'
  assert_line 'submit_job'
  assert_line 'report_submission'
  # Commands of the functions main calls are not traced.
  refute_line 'read_site_file "$site_file"'
  run grep -cvE $'^[0-9]+\\.[0-9]+\t' "$BATS_TEST_TMPDIR/trace dir/trace.tsv"
  assert_output 0
}

@test "trace_submit.sh: a trace file that cannot be written neither stops nor clutters a submission" {
  run --separate-stderr timeout 60 bash "$TRACER" "$BATS_TEST_TMPDIR/no such dir/trace.tsv" "$SUBMITTER" -e traced -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
  assert_line --index 0 --partial "Submitted job 4242"
  assert_equal "$stderr" ""
}

@test "trace_submit.sh: the submitter's exit status and message come through" {
  run --separate-stderr timeout 60 bash "$TRACER" "$BATS_TEST_TMPDIR/trace.tsv" "$SUBMITTER" --gpus x </dev/null
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --gpus expects a whole number, got 'x'"
}

@test "HPC_TRACE is no knob of the submitter: a submission with it set writes no trace" {
  HPC_TRACE="$BATS_TEST_TMPDIR/trace.tsv" run --separate-stderr timeout 60 "$SUBMITTER" -e plain -C "$ONE_LINE" --venv "$FAKE_VENV" </dev/null
  assert_success
  assert_file_not_exists "$BATS_TEST_TMPDIR/trace.tsv"
}
