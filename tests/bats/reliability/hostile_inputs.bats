#!/usr/bin/env bats
# Hostile input found by the adversarial review of issue 13, on the real local
# cluster: site profiles, shared node-local folders, inherited squeue
# settings, experiment lines. Each test name reads "<injected>: <what holds>".

load '../test_helper'

teardown() {
  cancel_test_jobs
  [[ -z "${sleeper:-}" ]] || scancel "$sleeper" 2>/dev/null || true
}

setup() {
  cluster_test_setup
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  sleeper=""
  pwned="$BATS_TEST_TMPDIR/pwned"
}

@test "a site profile with \$(...) in numeric keys, inline comments and env lines without NAME=: refused with file, line and key; nothing run, nothing created" {
  local site="$BATS_TEST_TMPDIR/my site.conf" line
  for line in "max_cpus_per_node = SECONDS[\$(touch $pwned)]" "max_nodes = a[\$(touch $pwned)]" \
    'env = NOEQ' 'env = A B=1' "partition = \$(touch $pwned)" 'provides_tmpdir = maybe # comment'; do
    printf 'partition = notmpdir   # inline comment\n%s\n' "$line" >"$site"
    run --separate-stderr "$SUBMITTER" --site "$site" -W none -g 0 -- true
    assert_failure 2
    assert_equal "${#stderr_lines[@]}" 1
    assert_regex "$stderr" "^job_submitter.sh: error: $site:2: [a-z_]+ expects "
  done
  assert_not_exist "$pwned"
  run find "$SCRATCH" -mindepth 1
  assert_output ''
}

@test "another user's symlink at <base>/<user> under a shared node-local base: the job fails naming the link; nothing behind it is touched" {
  local base="$BATS_TEST_TMPDIR/shared base" elsewhere="$BATS_TEST_TMPDIR/victim" site="$BATS_TEST_TMPDIR/shared.conf"
  mkdir -p "$base" "$elsewhere"
  echo keep >"$elsewhere/precious.txt"
  ln -s "$elsewhere" "$base/$(id -un)"
  printf 'partition = notmpdir\nprovides_tmpdir = no\ntmpdir_base = %s\n' "$base" >"$site"
  TEST_SITE=$site submit -W none -g 0 -t 5 -e shared_base -- echo should-not-run
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" FAILED
  run job_log "$job_id"
  assert_output --partial "$base/$(id -un) is a symlink; refusing to use it"
  refute_output --partial should-not-run
  assert_equal "$(ls -A "$elsewhere")" precious.txt
  assert_equal "$(cat "$elsewhere/precious.txt")" keep
}

@test "SQUEUE_STATES=PENDING and SQUEUE_PARTITION inherited by the node cleanup: a running job's folder is kept" {
  local base="$BATS_TEST_TMPDIR/ssd" me
  me="$base/$(id -un)"
  sleeper=$(sbatch --parsable -p notmpdir -o /dev/null --job-name=cleanup_sleeper --wrap 'sleep 120')
  sleeper=${sleeper%%;*}
  wait_job_state "$sleeper" 60 RUNNING
  mkdir -p "$me/$sleeper/node1" "$me/999999/node1"
  echo live >"$me/$sleeper/node1/f.txt"
  SQUEUE_STATES=PENDING SQUEUE_PARTITION=urgent run timeout 300 "$REPO_ROOT/plai_cleanups/submit_plai_cleanup" --base "$base" -p notmpdir --wait
  assert_success
  assert_line "node1: kept $me/$sleeper (job $sleeper is in squeue)"
  assert_line "node1: removed $me/999999/node1 (job 999999 is not in squeue)"
  assert_file_exist "$me/$sleeper/node1/f.txt"
}

@test "an experiment line 'NAME=value program' with an unset \$VAR: runs as in the shell (the variable set for the program, the unset one empty)" {
  local configs="$BATS_TEST_TMPDIR/configs.txt"
  # shellcheck disable=SC2016 # the node expands these, as the user wrote them
  printf '%s\n' 'GREETING="hello there" bash -c '\''echo "greeting=$GREETING unset=[$1]"'\'' _ "$NOT_SET_ON_THE_NODE"' >"$configs"
  submit -W none -g 0 -t 5 -e line_env -C "$configs"
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_line "greeting=hello there unset=[]"
}

@test "an array above the cluster's MaxArraySize (limit + 1 trials): planned as arrays of MaxArraySize tasks; --no-submit refused, nothing created" {
  local max
  max=$(scontrol show config | sed -n 's/^MaxArraySize *= *//p')
  run --separate-stderr "$SUBMITTER" --site local -W none -g 0 -e oversize --seeds $((max + 1)) --dry-run -- true
  assert_success
  assert_line --regexp "^#SBATCH --array=0-$((max - 1))(%[0-9]+)?\$"
  assert_line --partial "# Trials: $((max + 1)) (arrays of at most $max tasks, the cluster's MaxArraySize"
  run --separate-stderr "$SUBMITTER" --site local -W none -g 0 -e oversize --seeds $((max + 1)) --no-submit -- true
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: --no-submit: these $((max + 1)) trials go as several array jobs (the cluster's MaxArraySize is $max), which one 'sbatch job.sbatch' cannot queue; submit them"
  run find "$SCRATCH" -mindepth 1
  assert_output ''
}

@test "SBATCH_NO_REQUEUE, SBATCH_OPEN_MODE=truncate, SBATCH_TIMELIMIT and SBATCH_EXPORT=NONE in the submitting shell: the job keeps requeue, its wall time and its environment, and runs" {
  SBATCH_NO_REQUEUE=1 SBATCH_OPEN_MODE=truncate SBATCH_TIMELIMIT=1 SBATCH_EXPORT=NONE \
    submit -W none -g 0 -t 7 -e sbatch_env -- bash -c 'echo "exp=$exp_name path_has_bin=$([[ :$PATH: == *:/usr/bin:* ]] && echo yes)"'
  assert_equal "$(job_field "$job_id" Requeue)" 1
  assert_equal "$(job_field "$job_id" TimeLimit)" 00:07:00
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  run job_log "$job_id"
  assert_line 'exp=sbatch_env path_has_bin=yes'
}

@test "SCRATCH with '%' and a space: the log is where the submitter says, not a pattern sbatch expanded" {
  export SCRATCH="$BATS_TEST_TMPDIR/100% scratch"
  mkdir -p "$SCRATCH"
  submit -W none -g 0 -t 5 -e pct -- echo in-the-log
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  assert_file_contains "$SCRATCH/$project/hpc_outputs/${project}_pct_$job_id.out" '^in-the-log$'
}

@test "a submission from inside 'salloc --mem-per-cpu': the allocation's SLURM_* do not reach the job's sruns, and it runs" {
  local out status_file="$BATS_TEST_TMPDIR/status"
  # The inner submission's --wait exits with the job's exit code.
  out=$(salloc -n1 -c1 --mem-per-cpu=100M -p notmpdir bash -c \
    '"$1" --site local -p notmpdir -g 0 -W none -t 5 -e inside --wait -- true; echo "$?" >"$2"' \
    _ "$SUBMITTER" "$status_file" </dev/null 2>&1) || fail "salloc failed: $out"
  assert_equal "$(cat "$status_file")" 0
  [[ "$out" != *"mutually exclusive"* ]] || fail "srun refused the allocation's memory variables: $out"
}

@test "SBATCH_PARTITION, SBATCH_ARRAY_INX, SBATCH_JOB_NAME and SBATCH_GPUS_PER_TASK in the submitting shell: the job keeps its partition, trials, name and log, and gets no GPU" {
  local configs="$BATS_TEST_TMPDIR/four.txt" task
  printf 'true\n%.0s' 1 2 3 4 >"$configs"
  SBATCH_PARTITION=urgent SBATCH_ARRAY_INX=0-1 SBATCH_JOB_NAME=x SBATCH_GPUS_PER_TASK=1 \
    submit -p notmpdir -g 0 -W none -t 5 -e shellvars -C "$configs"
  assert_equal "$(job_field "$job_id" Partition)" notmpdir
  assert_equal "$(job_field "$job_id" JobName)" "${project}_shellvars"
  [[ "$(scontrol show job -o "$job_id" | head -n 1)" != *gpu* ]] || fail "the job got a GPU: $(scontrol show job "$job_id")"
  for task in 0 1 2 3; do
    wait_job_done "${job_id}_$task" 120
    assert_job_state "${job_id}_$task" COMPLETED
    assert_file_exists "$SCRATCH/$project/hpc_outputs/${project}_shellvars_${job_id}_$task.out"
  done
}

@test "a job.sbatch sbatch-ed from an empty environment (env -i: no HOME, no USER): it runs" {
  local line out
  run --separate-stderr "$SUBMITTER" --site local -p notmpdir -g 0 -W none -t 5 -e empty --no-submit -- true </dev/null
  assert_success
  line=${lines[-1]}
  out=$(cd / && env -i PATH=/usr/bin:/bin SLURM_CONF="$SLURM_CONF" bash -c "$line" 2>&1) || fail "'$line' failed: $out"
  job_id=${out##* }
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
}

@test "--account naming an account the user does not have: refused at submission (exit 2, one line) naming the user's accounts; nothing submitted, nothing created" {
  local before
  before=$(squeue -h -o %A | wc -l)
  run --separate-stderr "$SUBMITTER" --site local -a no-such-account -W none -g 0 -- true
  assert_failure 2
  assert_equal "${#stderr_lines[@]}" 1
  assert_regex "$stderr" "^job_submitter.sh: error: --account 'no-such-account' is not one of user $(id -un)'s accounts: .*def-lab.*rrg-lab"
  assert_equal "$(squeue -h -o %A | wc -l)" "$before"
  run find "$SCRATCH" -mindepth 2
  assert_output ''
}
