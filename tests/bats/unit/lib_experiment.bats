#!/usr/bin/env bats
# hpc_files/lib/experiment.sh experiment_jobs: an experiment's jobs as
# squeue (stubbed) lists them, found by the ids its submission folders
# recorded and by its job name; ask_queue asks squeue in the background.

load '../test_helper'

HPC_FILES_DIR="$REPO_ROOT/hpc_files"
HPC_PROG=job_submitter.sh
# shellcheck source=../../../hpc_files/lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=../../../hpc_files/lib/experiment.sh
source "$HPC_FILES_DIR/lib/experiment.sh"

setup() {
  bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  cat >"$bin/squeue" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$BATS_TEST_TMPDIR/squeue.argv"
[[ -f "$BATS_TEST_TMPDIR/squeue.out" ]] || exit 1
cat "$BATS_TEST_TMPDIR/squeue.out"
STUB
  chmod +x "$bin/squeue"
  PATH="$bin:$PATH"
  exp="$BATS_TEST_TMPDIR/exp dir/e"
  mkdir -p "$exp/20260101-000000-aaaa" "$exp/20260101-000100-bbbb"
}

@test "experiment_jobs: recorded ids (job_id, job_ids, controller, setup) and the experiment's job name, ascending, once each" {
  echo 30 >"$exp/20260101-000000-aaaa/job_id"
  printf '31\n32 11\n' >"$exp/20260101-000000-aaaa/job_ids"
  echo 33 >"$exp/20260101-000100-bbbb/bayes_controller_job_id"
  echo 29 >"$exp/20260101-000100-bbbb/setup_job_id"
  printf '%s\n' '32|RUNNING|x' '32|PENDING|x' '30|PENDING|x' '31|COMPLETING|p_e' '33|PENDING|p_e_bayes' \
    '29|RUNNING|p_e_setup_venv' '40|PENDING|p_e' '41|RUNNING|p_e_bayes' '42|RUNNING|p_f' 'garbage' >"$BATS_TEST_TMPDIR/squeue.out"
  run experiment_jobs "$exp" p_e <"$BATS_TEST_TMPDIR/squeue.out"
  assert_success
  assert_output "29
30
32
33
40"
}

@test "experiment_jobs: nothing listed prints nothing" {
  run experiment_jobs "$exp" p_e </dev/null
  assert_success
  assert_output ""
}

@test "ask_queue: the user's jobs from squeue in the background; await_answer fails, the answer empty, when squeue gives none" {
  printf '%s\n' '30|PENDING|p_e' >"$BATS_TEST_TMPDIR/squeue.out"
  USER=someone
  ask_queue
  await_answer queue
  assert_equal "$(<"$work_dir/answer.queue")" "30|PENDING|p_e"
  run cat "$BATS_TEST_TMPDIR/squeue.argv"
  assert_output "-h -u someone -o %F|%T|%j"
  printf 'partial\n' >"$BATS_TEST_TMPDIR/squeue.out"
  sed -i 's/^cat .*/&; exit 1/' "$BATS_TEST_TMPDIR/bin/squeue"
  ask_queue
  # Not under 'run': the wait must be the shell's that started squeue.
  local status=0
  await_answer queue || status=$?
  assert_equal "$status" 1
  assert_equal "$(<"$work_dir/answer.queue")" ""
  run_cleanup
}
