#!/usr/bin/env bats
# hpc_files/node/launch.sh run as one srun task would run it, without SLURM:
# a fake submission folder (node scripts, runtime_venv.sh, commands.txt), a
# fake venv whose python is the real one with a fake 'torch' package first on
# PYTHONPATH (so the torchrun probe reads the run.py text each test writes),
# and a fake torchrun that prints its argv.

load '../test_helper'

setup() {
  sub="$BATS_TEST_TMPDIR/sub mission"
  venv="$BATS_TEST_TMPDIR/fake venv"
  fake_torch="$BATS_TEST_TMPDIR/fake torch"
  mkdir -p "$sub/node" "$venv/bin" "$fake_torch/torch/distributed" "$BATS_TEST_TMPDIR/src"
  cp "$REPO_ROOT"/hpc_files/node/*.sh "$sub/node/"
  cp "$REPO_ROOT/virtual_env_hpc_files/runtime_venv.sh" "$sub/node/"
  : >"$fake_torch/torch/__init__.py"
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >"$venv/bin/python"
  # torchrun and any program print their argv (one word per line) and the
  # variables the test asks about.
  cat >"$venv/bin/torchrun" <<'STUB'
#!/usr/bin/env bash
printf 'argv:%s\n' "$@"
STUB
  cat >"$venv/bin/show" <<'STUB'
#!/usr/bin/env bash
printf 'argv:%s\n' "$@"
for name in $SHOW_VARS; do printf '%s=%s\n' "$name" "${!name-<unset>}"; done
STUB
  chmod +x "$venv/bin/python" "$venv/bin/torchrun" "$venv/bin/show"
  export HPC_SUBMISSION_DIR="$sub" HPC_VENV="$venv" HPC_RUNTIME=venv
  export PYTHONPATH="$fake_torch" source_dir="$BATS_TEST_TMPDIR/src"
  export HPC_NODES=1 HPC_PROCS_PER_NODE=2 HPC_SIGNAL_LEAD=90 SLURM_JOB_ID=1234
  export HPC_KIND=torchrun SHOW_VARS=""
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID HPC_PASS_LOCAL_RANK HPC_TMPDIR_MIMIC
}

# run_py TEXT: the fake torch's distributed/run.py.
run_py() {
  printf '%s\n' "$1" >"$fake_torch/torch/distributed/run.py"
}

# experiment LINE: the trial's command line.
experiment() {
  printf '%s\n' "$1" >"$sub/commands.txt"
}

launch() {
  run --separate-stderr bash "$sub/node/launch.sh"
}

@test "torch 2.10/2.11 (--signals-to-handle, no --shutdown-timeout): only the flag it knows" {
  run_py 'parser.add_argument("--signals-to-handle", default="SIGTERM")'
  experiment 'python train.py --lr 1'
  launch
  assert_success
  assert_line 'argv:--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1'
  refute_line --partial 'argv:--shutdown-timeout'
  assert_line 'argv:train.py'
}

@test "torch 2.12+ (both flags): signals forwarded with a shutdown grace" {
  run_py 'parser.add_argument("--signals-to-handle")
parser.add_argument("--shutdown-timeout")'
  experiment 'python train.py'
  launch
  assert_success
  assert_line 'argv:--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1'
  assert_line 'argv:--shutdown-timeout=75'
}

@test "--signal USR2: torchrun forwards USR2 too; --no-signal: the default list" {
  run_py 'parser.add_argument("--signals-to-handle")'
  experiment 'python train.py'
  HPC_SIGNAL=USR2 launch
  assert_success
  assert_line 'argv:--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2'
  HPC_SIGNAL='' launch
  assert_success
  assert_line 'argv:--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1'
}

@test "old torchrun (neither flag): neither is passed" {
  run_py 'parser.add_argument("--nnodes")'
  experiment 'python train.py'
  launch
  assert_success
  refute_line --partial 'argv:--signals-to-handle'
  refute_line --partial 'argv:--shutdown-timeout'
  assert_line 'argv:--standalone'
}

@test "NAME=value prefixes are exported for the command, as in the shell" {
  export HPC_KIND=none SHOW_VARS="FOO BAR"
  experiment 'FOO=1 BAR="two words" show --x "$FOO"'
  launch
  assert_success
  assert_equal "$output" 'argv:--x
argv:
FOO=1
BAR=two words'
}

@test "NAME=value prefixes before python under torchrun" {
  run_py 'parser.add_argument("--nnodes")'
  experiment 'OMP_NUM_THREADS=4 python -m pkg.train --a 1'
  launch
  assert_success
  assert_line 'argv:-m'
  assert_line 'argv:pkg.train'
  refute_line --partial OMP_NUM_THREADS
}

@test "an unset \$VAR expands to nothing, as in the shell" {
  export HPC_KIND=none
  unset NOT_SET_ANYWHERE
  experiment 'show --tag=$NOT_SET_ANYWHERE "${NOT_SET_ANYWHERE}" end'
  launch
  assert_success
  assert_equal "$output" 'argv:--tag=
argv:
argv:end'
}

@test "globs and braces reach the program as written (as --list-trials shows them); \$VAR expands" {
  export HPC_KIND=none X=value
  mkdir -p "$BATS_TEST_TMPDIR/cwd"
  : >"$BATS_TEST_TMPDIR/cwd/BENCHMARKS.md"
  cd "$BATS_TEST_TMPDIR/cwd"
  experiment 'show *.md {a,b} $X'
  launch
  assert_success
  assert_equal "$output" 'argv:*.md
argv:{a,b}
argv:value'
}

@test "a line of only assignments is refused as an empty command" {
  export HPC_KIND=none
  experiment 'FOO=1'
  launch
  assert_failure 1
  assert_equal "$stderr" 'hpc: error: trial 0 has an empty command'
}

@test "local_rank_shim.sh: --local-rank=N by default, --local_rank=N when asked" {
  export PATH="$venv/bin:$PATH" LOCAL_RANK=3
  HPC_PASS_LOCAL_RANK=1 run bash "$sub/node/local_rank_shim.sh" --no-python show a
  assert_success
  assert_equal "$output" $'argv:a\nargv:--local-rank=3'
  HPC_PASS_LOCAL_RANK=hyphen run bash "$sub/node/local_rank_shim.sh" --no-python show a
  assert_equal "$output" $'argv:a\nargv:--local-rank=3'
  HPC_PASS_LOCAL_RANK=underscore run bash "$sub/node/local_rank_shim.sh" --no-python show a
  assert_success
  assert_equal "$output" $'argv:a\nargv:--local_rank=3'
  printf 'import sys; print(sys.argv[1:])\n' >"$BATS_TEST_TMPDIR/prog.py"
  HPC_PASS_LOCAL_RANK=underscore run bash "$sub/node/local_rank_shim.sh" "$BATS_TEST_TMPDIR/prog.py" x
  assert_success
  assert_output "['x', '--local_rank=3']"
}

# container: the singularity stand-in (tests/bats/fixtures/standin) runs the
# command with only the variables passed into the container.
container() {
  export HPC_RUNTIME=singularity HPC_CONTAINER="$BATS_TEST_TMPDIR/image.sif"
  : >"$HPC_CONTAINER"
  cp "$REPO_ROOT/singularity_hpc_files/runtime_singularity.sh" "$sub/node/"
  export PATH="$REPO_ROOT/tests/bats/fixtures/standin:$PATH"
  export STANDIN_ARGV_LOG="$BATS_TEST_TMPDIR/standin.log" STANDIN_IMAGE_PATH="$venv/bin:/usr/bin:/bin"
  export HPC_CONTAINER_RUNTIME=singularity
}

@test "in a container, NAME=value prefixes and the names in HPC_PASS_ENV reach the command" {
  container
  export HPC_KIND=none SITE_ONLY=from-site NOT_LISTED=secret HPC_PASS_ENV="SITE_ONLY"
  experiment 'LINE_VAR="a b" env'
  launch
  assert_success
  assert_line 'LINE_VAR=a b'
  assert_line 'SITE_ONLY=from-site'
  refute_line --partial NOT_LISTED
}

@test "in a container, the code the job runs comes first on PYTHONPATH, before the image's own" {
  # --cleanenv drops the batch script's PYTHONPATH: without this, a job's
  # 'python scripts/x.py' imports its package from wherever the image (or an
  # editable install under the bound \$HOME) has it, not from the snapshot.
  container
  export HPC_KIND=none source_dir="$BATS_TEST_TMPDIR/sub/code" PYTHONPATH="/host/only"
  export STANDIN_IMAGE_ENV="PYTHONPATH=/opt/image/lib"
  export SHOW_VARS="PYTHONPATH" HPC_PASS_ENV="SHOW_VARS"
  mkdir -p "$source_dir"
  experiment 'show'
  launch
  assert_success
  assert_line "PYTHONPATH=$source_dir:/opt/image/lib"
  unset STANDIN_IMAGE_ENV # an image without one: no empty entry (the working folder)
  launch
  assert_success
  assert_line "PYTHONPATH=$source_dir"
}

@test "in a container, a passed value arrives as it is, though the container's shell evaluates it" {
  container
  export HPC_KIND=none SHOW_VARS="LITERAL SITE_ONLY" HPC_PASS_ENV="SHOW_VARS SITE_ONLY"
  export SITE_ONLY='a\b "c" `d` $e'
  experiment "LITERAL='\$HOME \\n \`id\`' show"
  launch
  assert_success
  assert_line 'LITERAL=$HOME \n `id`'
  assert_line 'SITE_ONLY=a\b "c" `d` $e'
}

@test "in a container, a bad name in HPC_PASS_ENV is skipped, not evaluated" {
  container
  export HPC_KIND=none HPC_PASS_ENV='A[$(touch $BATS_TEST_TMPDIR/pwned)] OK_NAME' OK_NAME=1
  experiment 'env'
  launch
  assert_success
  assert_line 'OK_NAME=1'
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}

@test "a wall-time signal during the torchrun probe (before the program starts): no program, the requeue marker, exit 42" {
  # The probe's python tells the test it runs, then waits a little: the test
  # sends USR1 to launch.sh meanwhile.
  local ready="$BATS_TEST_TMPDIR/probe running"
  printf '#!/bin/sh\n: >"%s"\nsleep 1\nexec %s "$@"\n' "$ready" "$(command -v python3)" >"$venv/bin/python"
  run_py 'parser.add_argument("--signals-to-handle")'
  experiment 'python train.py'
  export HPC_REQUEUE_MARKER="$BATS_TEST_TMPDIR/marker"
  bash "$sub/node/launch.sh" >"$BATS_TEST_TMPDIR/out" 2>&1 &
  local pid=$! status=0
  until [[ -e "$ready" ]]; do sleep 0.05; done
  kill -USR1 "$pid"
  wait "$pid" || status=$?
  assert_equal "$status" 42
  assert_file_exists "$HPC_REQUEUE_MARKER"
  run cat "$BATS_TEST_TMPDIR/out"
  assert_output --partial 'SIGUSR1 came before the program started; asking for a requeue without running it'
  refute_output --partial 'argv:train.py'
}

@test "a conda env (conda-meta/): CONDA_PREFIX and its activate.d scripts, which may read unset variables" {
  mkdir -p "$venv/conda-meta" "$venv/etc/conda/activate.d"
  # shellcheck disable=SC2016 # the activation script's own text
  printf 'export CUDA_FROM_CONDA="yes${NOT_SET_ANYWHERE}"\n' >"$venv/etc/conda/activate.d/cuda.sh"
  export HPC_KIND=none SHOW_VARS="CONDA_PREFIX CUDA_FROM_CONDA VIRTUAL_ENV"
  experiment 'show'
  launch
  assert_success
  assert_line "CONDA_PREFIX=$venv"
  assert_line "CUDA_FROM_CONDA=yes"
  assert_line "VIRTUAL_ENV=<unset>"
}

@test "--fresh is dropped when another job ran this trial of the folder first; kept for that job (and its requeues)" {
  export HPC_KIND=none
  experiment 'show --fresh --lr 1'
  mkdir -p "$sub/runs"
  # No first run recorded: kept.
  launch
  assert_success
  assert_line 'argv:--fresh'
  # This job ran first (a requeue of it): kept, the harness tells its own folder.
  echo 1234 >"$sub/runs/first.0"
  launch
  assert_line 'argv:--fresh'
  # 'sbatch job.sbatch' again: another job, so it resumes.
  echo 1200 >"$sub/runs/first.0"
  launch
  assert_success
  refute_line 'argv:--fresh'
  assert_line 'argv:--lr'
  assert_line 'hpc: without --fresh: job 1200 ran trial 0 of this submission first, started afresh; this run resumes'
}
