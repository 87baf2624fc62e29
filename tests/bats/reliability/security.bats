#!/usr/bin/env bats
# Secrets and hostile input on the real local cluster. Each test name reads
# "<what is injected>: <what must hold>".

load '../test_helper'

teardown() {
  cancel_test_jobs
}

setup() {
  cluster_test_setup
  export HOME="$BATS_TEST_TMPDIR/home"
  mkdir -p "$HOME"
  # Made here, so that no project file (nor its code snapshot) holds it.
  secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
  (umask 077 && echo "$secret" >"$HOME/wandb_credentials.txt")
  # A second secret already in the submitting environment.
  export MY_SERVICE_API_KEY="tok-$RANDOM$RANDOM-never-in-argv"
}

@test "a wandb key in ~/wandb_credentials.txt and an *_API_KEY in the environment: never in any process's argv during the job, the script, the submission folder, the log or scontrol show job -dd" {
  local out job_id
  # The program runs until the test has sampled /proc five times (it creates
  # 'sampled'; at most 2 minutes), however slowly the machine takes them.
  out=$("$SUBMITTER" --site local -n 2 -g 1 -c 1 -W lightning -t 5 -e secrets -- \
    bash -c 'echo "key_len=${#WANDB_API_KEY}"; for _ in $(seq 600); do [[ -e "$1" ]] && exit 0; sleep 0.2; done; exit 1' \
    _ "$BATS_TEST_TMPDIR/sampled" 2>&1)
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  [[ -n "$job_id" ]] || fail "no job id: $out"
  [[ "$out" != *"$secret"* ]] || fail "the submitter printed the key"
  # Sample every process's command line while the program runs (it has
  # printed key_len, so the job's whole process tree is up).
  local samples=0 hits="" file
  wait_log "$job_id" '^key_len=' 120
  while ((samples < 5)); do
    for file in $(grep -laF -e "$secret" -e "$MY_SERVICE_API_KEY" /proc/[0-9]*/cmdline 2>/dev/null); do
      hits+="$file: $(tr '\0' ' ' <"$file" 2>/dev/null) | "
    done
    samples=$((samples + 1))
    sleep 0.2
  done
  assert_equal "$(job_field "$job_id" JobState)" RUNNING
  touch "$BATS_TEST_TMPDIR/sampled"
  wait_job_done "$job_id" 120
  assert_job_state "$job_id" COMPLETED
  assert_equal "$hits" ""
  # The program did get the key (through its environment).
  run cat "$SCRATCH/$project/hpc_outputs/${project}_secrets_$job_id.out"
  assert_output --partial "key_len=40"
  refute_output --partial "$secret"
  run grep -rlF -e "$secret" -e "$MY_SERVICE_API_KEY" "$SCRATCH"
  assert_output ''
  run scontrol show job -dd "$job_id"
  refute_output --partial "$secret"
  refute_output --partial "$MY_SERVICE_API_KEY"
}

@test "a credentials file readable by the group: refused at submission (exit 2), nothing submitted or written" {
  chmod 0640 "$HOME/wandb_credentials.txt"
  run --separate-stderr "$SUBMITTER" --site local -W none -g 0 -e perm -- true
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $HOME/wandb_credentials.txt is readable by others (mode 640); run: chmod 600 '$HOME/wandb_credentials.txt'"
  run find "$SCRATCH" -mindepth 1
  assert_output ''
}

@test "hostile strings in a config line (\$(...), backticks, ;, quotes, commas, spaces, a leading -): carried verbatim to the program, never executed, no file touched" {
  local trap_dir="$BATS_TEST_TMPDIR/traps" configs="$BATS_TEST_TMPDIR/configs.txt"
  mkdir -p "$trap_dir"
  # Single-quoted words reach the program literally; unquoted $VAR would be
  # the node's expansion, as documented, so the hostile parts are quoted.
  cat >"$configs" <<EOF
bash tests/bats/fixtures/programs/print_args.sh '\$(touch $trap_dir/dollar)' '\`touch $trap_dir/backtick\`' 'a;touch $trap_dir/semicolon' 'x,y' 'with space' '-leading' "it's"
EOF
  local out job_id
  out=$("$SUBMITTER" --site local -W none -g 1 -t 5 -e 'hostile.name-1' -C "$configs" 2>&1)
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  [[ -n "$job_id" ]] || fail "no job id: $out"
  run ls "$trap_dir"
  assert_output ''
  wait_job_done "$job_id" 60
  assert_job_state "$job_id" COMPLETED
  run ls "$trap_dir"
  assert_output ''
  run cat "$SCRATCH/$project/hpc_outputs/${project}_hostile.name-1_$job_id.out"
  assert_output --partial "args=\$(touch $trap_dir/dollar) \`touch $trap_dir/backtick\` a;touch $trap_dir/semicolon x,y with space -leading it's"
}

@test "an experiment name with \$(...), spaces, quotes or a newline: refused with one line, nothing created" {
  local name
  for name in '$(touch /tmp/pwned)' 'a b' "it's" $'two\nlines' '-x' '../up'; do
    run --separate-stderr "$SUBMITTER" --site local -W none -g 0 --exp-name="$name" -- true
    assert_failure 2
    assert_equal "${#stderr_lines[@]}" 1
    assert_regex "$stderr" "^job_submitter.sh: error: --exp-name accepts letters, digits"
  done
  run find "$SCRATCH" -mindepth 1
  assert_output ''
  assert_not_exist /tmp/pwned
}

@test "submission folders and the files the submitter writes: private to the user (no group or world write), made with mktemp" {
  local out job_id dir
  out=$("$SUBMITTER" --site local -W none -g 0 -t 5 -e perms -- true 2>&1)
  job_id=$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<<"$out")
  dir=$(sed -n 's/^  submission: //p' <<<"$out")
  [[ -d "$dir" ]] || fail "no submission folder in: $out"
  run stat -c %a "$dir"
  assert_output 700
  run find "$dir" -perm /022
  assert_output ''
  wait_job_done "$job_id" 60
}
