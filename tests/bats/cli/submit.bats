#!/usr/bin/env bats
# Submitting with a stubbed sbatch: the submission folder, what sbatch gets
# (and does not get: secrets), failures that leave nothing behind, and the data
# tarball cache. No cluster needed.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  stub_sbatch_recording
}

# submit_ok ARG...: job_submitter.sh ARG... succeeds; sets output/stderr.
submit_ok() {
  run --separate-stderr timeout 60 "$SUBMITTER" "$@" </dev/null
  ((status == 0)) || fail "job_submitter.sh $* exited $status: $stderr"
}

# the_submission EXP: the one submission folder of EXP (sets sub).
the_submission() {
  local dirs
  dirs=$(submission_dirs "$1")
  [[ -n "$dirs" && "$dirs" != *$'\n'* ]] || fail "expected one submission folder for '$1', found: '$dirs'"
  sub=$dirs
}

@test "a submission writes its folder, calls sbatch once and reports the job" {
  submit_ok -e subm -C "$THREE_LINES" --venv "$FAKE_VENV"
  the_submission subm
  [[ "${sub##*/}" =~ ^[0-9]{8}-[0-9]{6}-[A-Za-z0-9]{4}$ ]] || fail "submission folder name: ${sub##*/}"
  local f
  for f in job.sbatch commands.txt trials.jsonl command.txt git.txt job_id experiment_configurations.txt \
    node/batch.sh node/launch.sh node/runtime_venv.sh node/runtime_singularity.sh code.tar; do
    assert_file_exists "$sub/$f"
  done
  tar -tf "$sub/code.tar" | grep -qx hpc_files/job_submitter.sh
  assert_equal "$(stat -c %a "$sub")" 700
  assert_equal "$(cat "$sub/job_id")" 4242
  assert_equal "$(wc -l <"$sub/commands.txt")" 3
  assert_equal "$(wc -l <"$sub/trials.jsonl")" 3
  assert_equal "$(sed -n 3p "$sub/commands.txt")" 'python train.py --lr 0.001 --name "two words"'
  cmp "$THREE_LINES" "$sub/experiment_configurations.txt"
  grep -q '^commit: ' "$sub/git.txt"
  grep -qx 'diff:' "$sub/git.txt"
  # The job names its own folder and runs the snapshot of the project.
  grep -qxF "export HPC_SUBMISSION_DIR='$sub'" "$sub/job.sbatch"
  grep -qxF "export source_dir='$sub/code'" "$sub/job.sbatch"
  assert_dir_exists "$SCRATCH/$PROJECT/hpc_outputs"
  assert_dir_exists "$SCRATCH/$PROJECT/subm/checkpoints"
  # stdout: the job id and where its logs go.
  assert_line --index 0 "Submitted job 4242 (3 trial(s), 1 node(s) x 1 GPU(s), -W lightning)"
  assert_line --index 1 "  log:        $SCRATCH/$PROJECT/hpc_outputs/${PROJECT}_subm_4242_<task>.out"
  assert_line --index 2 "  submission: $sub"
  # sbatch: once, from the submission folder, with the requeue protocol and
  # the wall time on its command line, where SBATCH_* variables cannot change them.
  assert_equal "$(cat "$STUB_SBATCH_LOG")" "--parsable
--open-mode=append
--signal=B:USR1@90
--requeue
--time=00-01:00:00
--export=ALL
job.sbatch
--"
  assert_equal "$(sed -n 1p "$STUB_SBATCH_LOG.where")" "$sub"
  # The contract's variable travels in sbatch's environment: an --export list
  # would make slurmd run a login shell before the job (SLURM_GET_USER_ENV).
  grep -qx 'HPC_CONTRACT_ON_COMMAND_LINE=1' "$STUB_SBATCH_LOG.env"
}

@test "the submitted script is the --dry-run script" {
  submit_ok -e same -C "$ONE_LINE" -n 2 -g 2 -W torchrun --venv "$FAKE_VENV"
  the_submission same
  dry -e same -C "$ONE_LINE" -n 2 -g 2 -W torchrun --venv "$FAKE_VENV"
  # The same, but for the preview's note and the folder it could not name.
  assert_line --index 1 '# Preview (--dry-run): nothing was written or submitted, and the submission'
  local preview=${output//"$SCRATCH/$PROJECT/same/<YYYYmmdd-HHMMSS-XXXX>"/"$sub"}
  assert_equal "$(cat "$sub/job.sbatch")" "$(sed 2,3d <<<"$preview")"
  assert_line "#SBATCH --output=\"$SCRATCH/$PROJECT/hpc_outputs/%x_%j.out\""
}

@test "command.txt holds the exact command, quoted" {
  submit_ok -e cmd --venv "$FAKE_VENV" -- python train.py 'two words' "it's"
  the_submission cmd
  assert_equal "$(cat "$sub/command.txt")" "$SUBMITTER -e cmd --venv $FAKE_VENV -- python train.py 'two words' 'it'\\''s'"
  assert_equal "$(cat "$sub/commands.txt")" "python train.py 'two words' 'it'\\''s'"
}

@test "the wandb key file is never copied, passed or printed" {
  # Made here, so that no file of the project (and so of its snapshot) holds it.
  local key
  key="wandb-fake-key-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  printf 'WANDB_API_KEY=%s\n' "$key" >"$HOME/wandb_credentials.txt"
  chmod 600 "$HOME/wandb_credentials.txt"
  submit_ok -e secret -C "$ONE_LINE"
  the_submission secret
  ! grep -rqF -- "$key" "$SCRATCH" || fail "the key is under SCRATCH: $(grep -rlF -- "$key" "$SCRATCH")"
  ! grep -qF -- "$key" "$STUB_SBATCH_LOG" "$STUB_SBATCH_LOG.where" || fail "the key is in sbatch's argv"
  ! grep -qF -- "$key" "$STUB_SBATCH_LOG.env" || fail "the key is in sbatch's environment"
  [[ "$output$stderr" != *"$key"* ]] || fail "the key was printed"
  # A wandb sweep too.
  submit_ok -e secret2 -w abc123 --sweep-count 2
  ! grep -rqF -- "$key" "$SCRATCH" "$STUB_SBATCH_LOG" "$STUB_SBATCH_LOG.env" || fail "the key leaked in a wandb sweep submission"
  [[ "$output$stderr" != *"$key"* ]] || fail "the key was printed"
}

@test "the submitting shell's SLURM_TMPDIR and MASTER_ADDR do not reach the job; MASTER_PORT does" {
  # Submitting from inside an allocation (salloc, a controller job): that job's
  # node-local folder and rendezvous host are not the new job's.
  SLURM_TMPDIR=/tmp/another_jobs_tmpdir MASTER_ADDR=127.0.0.1 MASTER_PORT=23456 submit_ok -e env -C "$ONE_LINE"
  ! grep -E '^(SLURM_TMPDIR|MASTER_ADDR)=' "$STUB_SBATCH_LOG.env" || fail "sbatch got the shell's node-local folder or rendezvous host"
  grep -qx 'MASTER_PORT=23456' "$STUB_SBATCH_LOG.env" || fail "sbatch lost MASTER_PORT, a documented override"
}

@test "what describes an enclosing allocation, sbatch/salloc/srun option variables and the toolkit's internals do not reach the job; site settings and knobs do" {
  # As inside 'salloc --mem-per-cpu=1G' or another toolkit job: SLURM_MEM_PER_CPU
  # beside the new job's SLURM_MEM_PER_NODE makes every srun in it fail.
  local -a shell=(SLURM_JOB_ID=7 SLURM_MEM_PER_CPU=1024 SLURM_CPUS_PER_TASK=3 SLURM_NTASKS=1
    SLURM_NODELIST=node1 SLURM_STEP_ID=0 SLURMD_NODENAME=node1 SRUN_CPUS_PER_TASK=3
    SALLOC_PARTITION=urgent SBATCH_ARRAY_INX=0-1 SBATCH_JOB_NAME=x SBATCH_GPUS_PER_TASK=1
    SBATCH_PARTITION=urgent SBATCH_EXPORT=NONE SBATCH_ACCOUNT=def-lab SBATCH_QOS=normal
    HPC_DATA_TARBALL=/elsewhere/data.tar HPC_BAYES_ROUND=2 HPC_VENV=/elsewhere/venv
    CUDA_VISIBLE_DEVICES=0 SLURM_TIME_FORMAT=relative HPC_WANDB=offline HPC_DIST_TIMEOUT=60)
  run --separate-stderr env "${shell[@]}" "$SUBMITTER" -e env -C "$ONE_LINE" -p notmpdir </dev/null
  ((status == 0)) || fail "the submission failed: $stderr"
  local leaked
  leaked=$(grep -E '^(SLURM_(JOB_ID|MEM_PER_CPU|CPUS_PER_TASK|NTASKS|NODELIST|STEP_ID)|SLURMD_NODENAME|SRUN_|SALLOC_|SBATCH_(ARRAY_INX|JOB_NAME|GPUS_PER_TASK|PARTITION|EXPORT)|HPC_(DATA_TARBALL|BAYES_ROUND|VENV)|CUDA_VISIBLE_DEVICES)' \
    "$STUB_SBATCH_LOG.env") && fail "sbatch got: $leaked"
  # No --account given: the user's SBATCH_ACCOUNT is their default account.
  local kept
  for kept in SLURM_CONF SLURM_TIME_FORMAT=relative SBATCH_ACCOUNT=def-lab SBATCH_QOS=normal HPC_WANDB=offline HPC_DIST_TIMEOUT=60; do
    grep -q "^$kept" "$STUB_SBATCH_LOG.env" || fail "sbatch lost $kept"
  done
}

@test "an SBATCH_ACCOUNT in the shell does not replace the account the submission sets" {
  SBATCH_ACCOUNT=rrg-lab submit_ok -e env -C "$ONE_LINE" -a def-lab
  ! grep -q '^SBATCH_ACCOUNT=' "$STUB_SBATCH_LOG.env" || fail "sbatch got the shell's SBATCH_ACCOUNT beside --account def-lab"
}

@test "a W&B key in the shell's WANDB_API_KEY is not passed, and one warning line says how to give the jobs a key" {
  WANDB_API_KEY=shell-key-1234 submit_ok -e env -C "$ONE_LINE"
  assert_equal "$stderr" "job_submitter.sh: warning: WANDB_API_KEY is not passed to the jobs (their environment is readable through scontrol); to give them a key, write it alone on one line of $HOME/wandb_credentials.txt and chmod 600 it"
  ! grep -q 'shell-key-1234' "$STUB_SBATCH_LOG.env" || fail "the key reached sbatch"
  # With the key in its file, nothing to say.
  printf 'file-key\n' >"$HOME/wandb_credentials.txt"
  chmod 600 "$HOME/wandb_credentials.txt"
  WANDB_API_KEY=shell-key-1234 submit_ok -e env2 -C "$ONE_LINE"
  assert_equal "$stderr" ""
}

@test "a Ctrl-C just as the submission folder is made leaves no folder behind" {
  # mkdir and mktemp stand-ins make the folder, then Ctrl-C their process
  # group (as a terminal does) before they return.
  local bin="$BATS_TEST_TMPDIR/interrupting" tool
  mkdir -p "$bin"
  for tool in mkdir mktemp; do
    cat >"$bin/$tool" <<STUB
#!/usr/bin/env bash
$(command -v "$tool") "\$@" || exit
case "\${!#}" in
  */exp-ctrlc/[0-9]*-*) kill -INT 0; sleep 5 ;;
esac
STUB
    chmod +x "$bin/$tool"
  done
  PATH="$bin:$PATH" run setsid env --default-signal=INT "$SUBMITTER" -e exp-ctrlc -C "$ONE_LINE" --no-submit </dev/null
  assert_equal "$status" 130
  assert_equal "$(find "$SCRATCH/$PROJECT/exp-ctrlc" -mindepth 1 -maxdepth 1 ! -name checkpoints)" ""
}

@test "a wandb key file others can read is refused before anything is written" {
  printf 'WANDB_API_KEY=x\n' >"$HOME/wandb_credentials.txt"
  chmod 644 "$HOME/wandb_credentials.txt"
  run --separate-stderr "$SUBMITTER" -e secret -C "$ONE_LINE" </dev/null
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $HOME/wandb_credentials.txt is readable by others (mode 644); run: chmod 600 '$HOME/wandb_credentials.txt'"
  assert_file_not_exists "$STUB_SBATCH_LOG"
  assert_equal "$(find "$SCRATCH" -mindepth 1 | wc -l)" 0
}

@test "a hostile configs line is carried verbatim and nothing in it runs" {
  local configs="$BATS_TEST_TMPDIR/hostile configs.txt" line
  line="python train.py --name \"\$(touch $BATS_TEST_TMPDIR/pwned)\" --x 'a;b' --y \"c,d\""
  printf '%s\n' "$line" >"$configs"
  submit_ok -e hostile -C "$configs"
  the_submission hostile
  assert_equal "$(cat "$sub/commands.txt")" "$line"
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
  run grep -c 'pwned' "$sub/job.sbatch"
  assert_output 0
}

@test "a hostile command after -- is quoted and nothing in it runs" {
  submit_ok -e hostile -- python train.py "\$(touch $BATS_TEST_TMPDIR/pwned)" '`touch x`' 'a;b' 'c,d' "it's" '$HOME'
  the_submission hostile
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
  # commands.txt read back by the shell gives the words given.
  local -a words
  eval "words=($(cat "$sub/commands.txt"))"
  assert_equal "${#words[@]}" 8
  assert_equal "${words[2]}" "\$(touch $BATS_TEST_TMPDIR/pwned)"
  assert_equal "${words[3]}" '`touch x`'
  assert_equal "${words[6]}" "it's"
  assert_equal "${words[7]}" '$HOME'
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}

@test "a command after -- with a newline in a word is refused naming '--'" {
  run --separate-stderr "$SUBMITTER" -e newline -- python train.py $'new\nline' </dev/null
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: a word after '--' contains a newline; put such a command in a --configs file or a script"
  assert_file_not_exists "$STUB_SBATCH_LOG"
}

@test "sbatch failing: exit 1, one line with sbatch's message, the submission folder removed" {
  STUB_SBATCH_FAIL=$'sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\nsecond line'
  export STUB_SBATCH_FAIL
  run --separate-stderr "$SUBMITTER" -e failing -C "$ONE_LINE" </dev/null
  assert_failure 1
  assert_equal "$output" ""
  assert_equal "$stderr" "job_submitter.sh: error: sbatch refused the job: sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified second line"
  assert_file_exists "$STUB_SBATCH_LOG"
  assert_equal "$(submission_dirs failing)" ""
}

@test "sbatch printing no job id: exit 1" {
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  printf '#!/usr/bin/env bash\necho "Submitted batch job"\n' >"$bin/sbatch"
  run --separate-stderr "$SUBMITTER" -e noid -C "$ONE_LINE" </dev/null
  assert_failure 1
  assert_equal "$stderr" "job_submitter.sh: error: sbatch printed no job id: Submitted batch job"
  # (The folder is kept: sbatch exited 0, so a job may be queued that reads it.)
}

@test "sbatch --parsable with a cluster name: the job id is the part before ';'" {
  local bin="$BATS_TEST_TMPDIR/stub-bin"
  printf '#!/usr/bin/env bash\necho "4243;cedar"\n' >"$bin/sbatch"
  submit_ok -e clus -C "$ONE_LINE"
  the_submission clus
  assert_equal "$(cat "$sub/job_id")" 4243
  assert_line --index 0 --partial "Submitted job 4243 "
}

@test "works from another directory: the project root comes from the script's location" {
  local configs="$BATS_TEST_TMPDIR/c.txt"
  cp "$ONE_LINE" "$configs"
  cd /
  submit_ok -e elsewhere -C "$configs"
  the_submission elsewhere
  assert_line "  log:        $SCRATCH/$PROJECT/hpc_outputs/${PROJECT}_elsewhere_4242.out"
  grep -qxF "export source_dir='$sub/code'" "$sub/job.sbatch" ||
    fail "source_dir is not the repository's snapshot: $(grep source_dir "$sub/job.sbatch")"
  tar -tf "$sub/code.tar" | grep -qx hpc_files/job_submitter.sh
}

@test "relative and ./ invocations find the same project root" {
  local script
  for script in "$REPO_ROOT/hpc_files/job_submitter.sh" hpc_files/job_submitter.sh ./hpc_files/job_submitter.sh \
    hpc_files/../hpc_files//job_submitter.sh; do
    cd "$REPO_ROOT"
    run --separate-stderr bash "$script" --dry-run --no-snapshot -C "$ONE_LINE" </dev/null
    assert_success
    [[ "$output" == *$'\n'"export source_dir=$REPO_ROOT"$'\n'* || "$output" == *$'\n'"export source_dir='$REPO_ROOT'"$'\n'* ]] ||
      fail "$script: source_dir is not the repository: $(grep source_dir <<<"$output")"
  done
  cd "$REPO_ROOT/hpc_files"
  run --separate-stderr bash job_submitter.sh --dry-run --no-snapshot -C "$ONE_LINE" </dev/null
  assert_success
  [[ "$output" == *$'\n'"export source_dir=$REPO_ROOT"$'\n'* || "$output" == *$'\n'"export source_dir='$REPO_ROOT'"$'\n'* ]] ||
    fail "job_submitter.sh from hpc_files/: source_dir is not the repository"
}

@test "a project outside git submits; git.txt says so" {
  local project="$BATS_TEST_TMPDIR/nogit/proj" dir
  mkdir -p "$project"
  cp -r "$REPO_ROOT/hpc_files" "$REPO_ROOT/virtual_env_hpc_files" "$REPO_ROOT/singularity_hpc_files" "$project/"
  run --separate-stderr env GIT_CEILING_DIRECTORIES="$BATS_TEST_TMPDIR" \
    "$project/hpc_files/job_submitter.sh" -e nogit -g 0 -W none -- true </dev/null
  assert_success
  dir=$(find "$SCRATCH/proj/nogit" -mindepth 1 -maxdepth 1 -type d ! -name checkpoints)
  assert_equal "$(cat "$dir/git.txt")" "commit: not a git repository
source: $project
status:
diff:"
}

@test "two submissions in the same second get two folders" {
  submit_ok -e twice -C "$ONE_LINE"
  submit_ok -e twice -C "$ONE_LINE"
  assert_equal "$(submission_dirs twice | wc -l)" 2
  assert_equal "$(grep -c '^--$' "$STUB_SBATCH_LOG")" 2
}

# --- data tarball ------------------------------------------------------------

# make_data: two small folders under $SCRATCH/$PROJECT.
make_data() {
  mkdir -p "$SCRATCH/$PROJECT/ds one/sub" "$SCRATCH/$PROJECT/labels"
  printf 'a\n' >"$SCRATCH/$PROJECT/ds one/a.txt"
  printf 'b\n' >"$SCRATCH/$PROJECT/ds one/sub/b.txt"
  printf 'l\n' >"$SCRATCH/$PROJECT/labels/l.csv"
  cache="$SCRATCH/$PROJECT/.hpc_data_cache"
}

# tarballs: the data tarballs in the cache, one a line.
tarballs() {
  find "$cache" -maxdepth 1 -type f -name 'data-*.tar*' ! -name '*.manifest' ! -name '*.meta' ! -name '*.lock' | LC_ALL=C sort
}

@test "data: two folders become one tarball with a manifest and a meta file" {
  make_data
  submit_ok -e data -C "$ONE_LINE" -d 'ds one' labels
  local tarball
  tarball=$(tarballs)
  [[ -n "$tarball" && "$tarball" != *$'\n'* ]] || fail "expected one tarball, found: $tarball"
  assert_file_exists "$tarball.manifest"
  assert_file_exists "$tarball.meta"
  assert_regex "$stderr" "data: building ${tarball##*/} from 2 path\(s\)"
  run tar -tf "$tarball"
  assert_line "ds one/a.txt"
  assert_line "ds one/sub/b.txt"
  assert_line "labels/l.csv"
  assert_equal "$(sed -n 's/^tarball_bytes=//p' "$tarball.meta")" "$(stat -c %s "$tarball")"
  # content_bytes: the sizes in the manifest (files and folders), at least the 6 bytes of the files.
  (($(sed -n 's/^content_bytes=//p' "$tarball.meta") >= 6)) || fail "content_bytes too small: $(cat "$tarball.meta")"
  the_submission data
  grep -qF "export HPC_DATA_TARBALL=$(HPC_PROG=x bash -c 'source "$1/lib/common.sh"; shell_quote "$2"' _ "$REPO_ROOT/hpc_files" "$tarball")" "$sub/job.sbatch" ||
    fail "job.sbatch does not name the tarball: $(grep HPC_DATA_TARBALL "$sub/job.sbatch")"
}

@test "data: a second submission reuses the tarball" {
  make_data
  submit_ok -e data -C "$ONE_LINE" -d 'ds one' labels
  local tarball first
  tarball=$(tarballs)
  first=$(stat -c '%i %Y' "$tarball")
  submit_ok -e data -C "$ONE_LINE" -d labels -d 'ds one'
  assert_regex "$stderr" "data: reusing ${tarball##*/} \(manifest unchanged\)"
  assert_equal "$(tarballs)" "$tarball"
  assert_equal "$(stat -c '%i %Y' "$tarball")" "$first"
}

@test "data: a changed file builds a new tarball; the earlier submission keeps naming its own, unchanged" {
  make_data
  submit_ok -e data -C "$ONE_LINE" -d 'ds one' labels
  local tarball first_sbatch
  tarball=$(tarballs)
  the_submission data
  first_sbatch=$sub/job.sbatch
  printf 'changed\n' >"$SCRATCH/$PROJECT/labels/l.csv"
  touch -d '+1 min' "$SCRATCH/$PROJECT/labels/l.csv"
  submit_ok -e data -C "$ONE_LINE" -d 'ds one' labels
  local new
  new=$(tarballs | grep -vxF "$tarball")
  [[ -n "$new" && "$new" != *$'\n'* ]] || fail "expected one new tarball beside $tarball, found: $(tarballs)"
  assert_regex "$stderr" "data: building ${new##*/} from 2 path\(s\); 1 earlier tarball\(s\) of these paths \([0-9]+ MiB\) stay for the submissions that name them"
  assert_equal "$(tar -xOf "$new" labels/l.csv)" changed
  # A job queued (or sbatched again) from the first submission stages what it was submitted with.
  assert_equal "$(tar -xOf "$tarball" labels/l.csv)" l
  grep -qF "${tarball##*/}" "$first_sbatch" || fail "the first job.sbatch no longer names ${tarball##*/}"
  local second
  second=$(submission_dirs data | grep -vxF "${first_sbatch%/job.sbatch}")
  grep -qF "${new##*/}" "$second/job.sbatch" || fail "the new job.sbatch does not name ${new##*/}"
}

@test "data: tar failing -> exit 1, no tarball left, nothing submitted" {
  make_data
  mkdir -p "$BATS_TEST_TMPDIR/fake-tar"
  printf '#!/usr/bin/env bash\necho "tar: simulated failure" >&2\nexit 1\n' >"$BATS_TEST_TMPDIR/fake-tar/tar"
  chmod +x "$BATS_TEST_TMPDIR/fake-tar/tar"
  # --no-snapshot: the code snapshot uses tar too, and would fail first.
  PATH="$BATS_TEST_TMPDIR/fake-tar:$PATH" run --separate-stderr "$SUBMITTER" -e data -C "$ONE_LINE" --no-snapshot -d 'ds one' labels </dev/null
  assert_failure 1
  assert_equal "$output" ""
  assert_equal "${stderr_lines[-1]}" "job_submitter.sh: error: tar failed (exit 1) building the data tarball; nothing was submitted"
  assert_equal "$(tarballs)" ""
  assert_equal "$(find "$cache" -name '*.manifest*' -o -name '*.meta*' -o -name '*.tmp*')" ""
  assert_file_not_exists "$STUB_SBATCH_LOG"
  assert_equal "$(submission_dirs data)" ""
}

@test "data: five concurrent submissions build exactly one tarball and all succeed" {
  make_data
  local i pids=() failed=0 builds
  for i in 1 2 3 4 5; do
    timeout 120 "$SUBMITTER" -e data -C "$ONE_LINE" -d 'ds one' labels \
      >"$BATS_TEST_TMPDIR/out.$i" 2>"$BATS_TEST_TMPDIR/err.$i" </dev/null &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || failed=$((failed + 1))
  done
  ((failed == 0)) || fail "$failed submission(s) failed: $(cat "$BATS_TEST_TMPDIR"/err.*)"
  builds=$(cat "$BATS_TEST_TMPDIR"/err.* | grep -c 'data: building') || true
  assert_equal "$builds" 1
  assert_equal "$(cat "$BATS_TEST_TMPDIR"/err.* | grep -c 'data: reusing')" 4
  assert_equal "$(tarballs | wc -l)" 1
  assert_equal "$(find "$cache" -name '*.tmp*' | wc -l)" 0
  assert_equal "$(grep -c '^--$' "$STUB_SBATCH_LOG")" 5
  assert_equal "$(submission_dirs data | wc -l)" 5
  tar -tf "$(tarballs)" >/dev/null
}

@test "SCRATCH with '%': sbatch gets '%%' in --output, the report names the real file; '\"' or '\\' is refused" {
  export SCRATCH="$BATS_TEST_TMPDIR/100% scratch"
  mkdir -p "$SCRATCH"
  SCRATCH_ROOT=$SCRATCH
  submit_ok -e pct -C "$ONE_LINE"
  the_submission pct
  grep -qxF "#SBATCH --output=\"$BATS_TEST_TMPDIR/100%% scratch/$PROJECT/hpc_outputs/%x_%j.out\"" "$sub/job.sbatch"
  assert_line --index 1 "  log:        $SCRATCH/$PROJECT/hpc_outputs/${PROJECT}_pct_4242.out"
  rm -f "$STUB_SBATCH_LOG"
  SCRATCH="$BATS_TEST_TMPDIR/a\"b" refuse "SCRATCH must not contain '\"' or '\\'" -- -C "$ONE_LINE"
  SCRATCH="$BATS_TEST_TMPDIR/a\\b" refuse "SCRATCH must not contain '\"' or '\\'" -- -C "$ONE_LINE"
}

@test "--prune-data-cache removes the tarballs no submission folder names and keeps the others" {
  make_data
  submit_ok -e keep -C "$ONE_LINE" -d 'ds one'
  submit_ok -e drop -C "$ONE_LINE" -d labels
  assert_equal "$(tarballs | wc -l)" 2
  local kept
  kept=$(grep -h '^export HPC_DATA_TARBALL=' "$(submission_dirs keep)/job.sbatch")
  kept=${kept##*/}
  kept=${kept%\'}
  rm -rf "$(submission_dirs drop)"
  run --separate-stderr "$SUBMITTER" --prune-data-cache </dev/null
  assert_success
  assert_equal "$(tarballs | sed 's|.*/||')" "$kept"
  [[ "$stderr" == *"data cache: removed 1 tarball(s), 0 MiB; kept 1 named by a submission folder or in use"* ]] ||
    fail "stderr: $stderr"
  assert_equal "$(find "$cache" -name 'data-*' ! -name "$kept*" | wc -l)" 0
}

@test "data: building the tarball on a terminal shows how far tar has got" {
  make_data
  head -c 30000000 /dev/zero >"$SCRATCH/$PROJECT/ds one/big.bin"
  run script -qec "$(printf '%q ' "$SUBMITTER" -e tty -C "$ONE_LINE" -d 'ds one') </dev/null" /dev/null
  assert_success
  [[ "$output" == *"job_submitter.sh: data: W: "*" of 28 MiB"* ]] || fail "no progress line in: $output"
}

