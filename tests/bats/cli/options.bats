#!/usr/bin/env bats
# Every spelling of every job_submitter.sh option, in both forms ('--opt value'
# and '--opt=value'), has its effect, observed in the --dry-run script (or
# --list-trials). Refusals are in validation.bats.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  BASE=(-C "$ONE_LINE")
}

# gives LINE VALUE SPELLING... [-- ARG...]: for every SPELLING, both
# 'SPELLING VALUE' and (long spellings) 'SPELLING=VALUE', with BASE and ARG...,
# render a script that has the exact line LINE.
gives() {
  local want=$1 value=$2 spelling forms=() extra=()
  shift 2
  while (($# > 0)) && [[ "$1" != -- ]]; do
    forms+=("$1")
    shift
  done
  (($# == 0)) || extra=("${@:2}")
  for spelling in "${forms[@]}"; do
    dry ${BASE[@]+"${BASE[@]}"} ${extra[@]+"${extra[@]}"} "$spelling" "$value"
    assert_line "$want"
    if [[ "$spelling" == --* ]]; then
      dry ${BASE[@]+"${BASE[@]}"} ${extra[@]+"${extra[@]}"} "$spelling=$value"
      assert_line "$want"
    fi
  done
}

# quoted WORD: WORD as the rendered script writes it (the library's shell_quote).
quoted() {
  (HPC_PROG=x source "$REPO_ROOT/hpc_files/lib/common.sh" && shell_quote "$1")
}

@test "defaults: one node, one GPU, 2 CPUs, 10G, one hour, lightning, exp 'default'" {
  dry "${BASE[@]}"
  assert_line "#SBATCH --job-name=${PROJECT}_default"
  assert_line "#SBATCH --nodes=1"
  assert_line "#SBATCH --ntasks-per-node=1"
  assert_line "#SBATCH --cpus-per-task=2"
  assert_line "#SBATCH --gres=gpu:1"
  assert_line "#SBATCH --mem=10G"
  assert_line "#SBATCH --time=00-01:00:00"
  assert_line "#SBATCH --signal=B:USR1@90"
  assert_line "export HPC_KIND=lightning"
  assert_line "export HPC_MAX_REQUEUES=10"
  assert_line "export exp_name=default"
  refute_line --partial "#SBATCH --array"
  refute_line --partial "#SBATCH --account"
  refute_line --partial "#SBATCH --partition"
}

@test "-a/--account" {
  gives "#SBATCH --account=def-pi" def-pi -a --account
}

@test "-g/--gpus" {
  gives "#SBATCH --gres=gpu:3" 3 -g --gpus
  assert_line "#SBATCH --ntasks-per-node=3"
}

@test "-g with leading zeros is read as decimal" {
  gives "#SBATCH --gres=gpu:8" 08 -g
}

@test "-c/--cpus/--cpu" {
  gives "#SBATCH --cpus-per-task=5" 5 -c --cpus --cpu
}

@test "-W/--which-distributed torchrun" {
  gives "export HPC_KIND=torchrun" torchrun -W --which-distributed -- -g 2 -c 3
  assert_line "#SBATCH --ntasks-per-node=1"
  assert_line "#SBATCH --cpus-per-task=6"
  assert_line "export HPC_PROCS_PER_NODE=2"
}

@test "-W script is torchrun" {
  gives "export HPC_KIND=torchrun" script -W --which-distributed
}

@test "-W none" {
  gives "export HPC_KIND=none" none -W --which-distributed
}

@test "-W lightning" {
  gives "export HPC_KIND=lightning" lightning -W --which-distributed -- -g 2
  assert_line "#SBATCH --ntasks-per-node=2"
}

@test "-t/--time" {
  gives "#SBATCH --time=2:00:00" 2:00:00 -t --time
}

@test "-t accepts every SLURM time format" {
  local t
  for t in 30 30:15 2:00:00 1-0 1-2:30 1-02:03:04 7-00:00:00; do
    dry "${BASE[@]}" -t "$t"
    assert_line "#SBATCH --time=$t"
  done
}

@test "-m/--mem-per-gpu is per GPU" {
  gives "#SBATCH --mem=6G" 3G -m --mem-per-gpu -- -g 2
}

@test "-m in MiB and without a unit" {
  dry "${BASE[@]}" -m 512M -g 3
  assert_line "#SBATCH --mem=1536M"
  dry "${BASE[@]}" -m 1536 -g 2
  assert_line "#SBATCH --mem=3G"
}

@test "-G/--gpu-type" {
  gives "#SBATCH --gres=gpu:v100l:2" v100l -G --gpu-type -- --site cedar -g 2
}

@test "-e/--exp-name" {
  gives "export exp_name=run-1.a" run-1.a -e --exp-name
  assert_line "#SBATCH --job-name=${PROJECT}_run-1.a"
  assert_line "export scratch_dir=$(quoted "$SCRATCH/$PROJECT")"
}

@test "-w/--wandb-sweepid makes an array of wandb agents" {
  BASE=()  # the sweep names the experiments; -C would conflict
  gives "#SBATCH --array=0-2" abc123 -w --wandb-sweepid -- --sweep-count 3
  assert_line "export HPC_KIND=none"
}

@test "-w accepts ENTITY/PROJECT/ID" {
  run --separate-stderr "$SUBMITTER" --list-trials -w me/proj.x/abc123 --sweep-count 2 </dev/null
  assert_success
  assert_equal "${#lines[@]}" 2
  assert_line --index 1 '{"argv":["wandb","agent","--count","1","me/proj.x/abc123"],"params":{},"source":"wandb:me/proj.x/abc123","trial":1}'
}

@test "--sweep-count" {
  BASE=()  # the sweep names the experiments; -C would conflict
  gives "#SBATCH --array=0-4" 5 --sweep-count -- -w abc123
}

@test "-n/-N/--num-nodes/--num_nodes/--nodes" {
  gives "#SBATCH --nodes=2" 2 -n -N --num-nodes --num_nodes --nodes
  assert_line "export HPC_NODES=2"
}

@test "-s/--singularity-container" {
  gives "export HPC_RUNTIME=singularity" "$DUMMY_SIF" -s --singularity-container
  assert_line "export HPC_CONTAINER=$(quoted "$(realpath "$DUMMY_SIF")")"
}

@test "-C/--configs: one array task per line" {
  BASE=()
  gives "#SBATCH --array=0-2" "$THREE_LINES" -C --configs
  assert_line "# Trials: 3 (array task K runs line K+1 of commands.txt)."
}

@test "-p/--partition" {
  gives "#SBATCH --partition=gpu,gpu2" gpu,gpu2 -p --partition
}

@test "-d/--data names the tarball by the sorted paths" {
  local one two
  mkdir -p "$SCRATCH/$PROJECT/a" "$SCRATCH/$PROJECT/b"
  dry "${BASE[@]}" -d a
  one=$(grep '^export HPC_DATA_TARBALL=' <<<"$output")
  [[ "$one" == *"/$PROJECT/.hpc_data_cache/data-"*.tar* ]] || fail "no tarball line: $one"
  gives "$one" a --data
  dry "${BASE[@]}" -d a b
  two=$(grep '^export HPC_DATA_TARBALL=' <<<"$output")
  [[ "$two" != "$one" ]] || fail "-d a b names the same tarball as -d a"
  gives "$two" "b" -d --data -- -d a
  dry "${BASE[@]}" -d b a
  assert_line "$two"
  dry "${BASE[@]}" -d ./a b/
  assert_line "$two"
}

@test "-d takes several paths after one flag, up to the next option, and is repeatable" {
  local want
  mkdir -p "$SCRATCH/$PROJECT/a" "$SCRATCH/$PROJECT/b" "$SCRATCH/$PROJECT/c"
  dry "${BASE[@]}" -d a b c
  want=$(grep '^export HPC_DATA_TARBALL=' <<<"$output")
  dry "${BASE[@]}" -d a -d b --data=c
  assert_line "$want"
  dry "${BASE[@]}" -d a b -g 3 --data c
  assert_line "$want"
  assert_line "#SBATCH --gres=gpu:3"
}

@test "--sweep: one array task per grid point" {
  BASE=()  # the sweep names the experiments; -C would conflict
  gives "#SBATCH --array=0-5" "$REPO_ROOT/sweeper.yml" --sweep
  assert_line "# Trials: 6 (array task K runs line K+1 of commands.txt)."
}

@test "--trials keeps the first N grid points" {
  BASE=()  # the sweep names the experiments; -C would conflict
  gives "#SBATCH --array=0-1" 2 --trials -- --sweep "$REPO_ROOT/sweeper.yml"
}

@test "--sweep-seed picks the random draws" {
  local sweep="$FIXTURES/sweeps/random_probe.yml" seed1 seed1again seed2
  seed1=$("$SUBMITTER" --list-trials --sweep "$sweep" --trials 2 --sweep-seed 1)
  seed1again=$("$SUBMITTER" --list-trials --sweep "$sweep" --trials 2 --sweep-seed=1)
  seed2=$("$SUBMITTER" --list-trials --sweep "$sweep" --trials 2 --sweep-seed 2)
  assert_equal "$(wc -l <<<"$seed1")" 2
  assert_equal "$seed1again" "$seed1"
  [[ "$seed2" != "$seed1" ]] || fail "--sweep-seed 1 and 2 drew the same trials"
}

@test "--array-throttle" {
  BASE=(-C "$THREE_LINES")
  gives "#SBATCH --array=0-2%2" 2 --array-throttle
}

@test "--array-throttle defaults to the site's" {
  dry -C "$THREE_LINES" --site cedar
  assert_line "#SBATCH --array=0-2%16"
  dry -C "$THREE_LINES" --site cedar --array-throttle 3
  assert_line "#SBATCH --array=0-2%3"
}

@test "--seeds repeats every experiment with --seed=0..N-1" {
  gives "#SBATCH --array=0-1" 2 --seeds
  run "$SUBMITTER" --list-trials "${BASE[@]}" --seeds 2
  assert_success
  assert_line --index 0 --partial '"argv":["python","train.py","--lr","0.1","--seed=0"]'
  assert_line --index 1 --partial '"argv":["python","train.py","--lr","0.1","--seed=1"]'
}

@test "--signal-lead" {
  gives "#SBATCH --signal=B:USR1@120" 120 --signal-lead
  assert_line "export HPC_SIGNAL_LEAD=120"
}

@test "--max-requeues" {
  gives "export HPC_MAX_REQUEUES=3" 3 --max-requeues
}

@test "--dependency" {
  gives "#SBATCH --dependency=afterok:12:13,singleton" afterok:12:13,singleton --dependency
}

@test "--modules" {
  gives 'module load a/1 b || { echo "hpc: error: module load a/1 b failed" >&2; exit 1; }' "a/1 b" --modules
}

@test "--modules overrides the site's" {
  dry "${BASE[@]}" --site cedar
  assert_line --partial "module load StdEnv/2023 python/3.11 ||"
  dry "${BASE[@]}" --site cedar --modules cuda
  assert_line --partial "module load cuda ||"
  refute_line --partial "StdEnv"
}

@test "--site NAME, --site FILE and HPC_SITE" {
  local file="$BATS_TEST_TMPDIR/my site.conf"
  gives "#SBATCH --partition=tmpdir" local --site
  printf 'partition = mine\n' >"$file"
  gives "#SBATCH --partition=mine" "$file" --site
  HPC_SITE=local dry "${BASE[@]}"
  assert_line "#SBATCH --partition=tmpdir"
}

@test "--venv" {
  gives "export HPC_VENV=$(quoted "$FAKE_VENV")" "$FAKE_VENV" --venv
}

@test "--setup-venv uses the project's .venv" {
  printf 'numpy\n' >"$BATS_TEST_TMPDIR/requirements.txt"
  gives "export HPC_VENV=$(quoted "$REPO_ROOT/.venv")" "$BATS_TEST_TMPDIR/requirements.txt" --setup-venv
}

@test "--stage-out" {
  gives "export HPC_STAGE_OUT=results/run1" results/run1 --stage-out
}

@test "--compress" {
  command -v zstd >/dev/null || skip "zstd is not installed"
  mkdir -p "$SCRATCH/$PROJECT/a"
  gives "export HPC_COMPRESS=zstd" zstd --compress -- -d a
  assert_line --regexp '^export HPC_DATA_TARBALL=.*\.tar\.zst'\''?$'
}

@test "--compress without -d: one warning line, the job is still made" {
  command -v zstd >/dev/null || skip "zstd is not installed"
  run --separate-stderr "$SUBMITTER" --dry-run "${BASE[@]}" --compress zstd </dev/null
  assert_success
  assert_equal "$stderr" "job_submitter.sh: warning: --compress zstd compresses the data tarball of -d, and there is no -d: nothing is compressed"
  assert_line "#!/bin/bash"
}

@test "--compress none is the default and adds nothing" {
  gives "export HPC_RUNTIME=venv" none --compress
  refute_line --partial HPC_COMPRESS
}

@test "--sbatch-arg=ARG is repeatable and quotes values with spaces" {
  dry "${BASE[@]}" --sbatch-arg=--constraint=ib --sbatch-arg='--comment=two words'
  assert_line "#SBATCH --constraint=ib"
  assert_line '#SBATCH --comment="two words"'
}

@test "--sbatch-arg ARG (space form)" {
  gives "#SBATCH --constraint=ib" --constraint=ib --sbatch-arg
}

@test "--pass-local-rank" {
  dry "${BASE[@]}" -W torchrun --pass-local-rank
  assert_line "export HPC_PASS_LOCAL_RANK=1"
}

@test "--list-trials prints the manifest and writes nothing" {
  run --separate-stderr "$SUBMITTER" --list-trials -C "$THREE_LINES"
  assert_success
  assert_equal "${#lines[@]}" 3
  assert_line --index 2 '{"argv":["python","train.py","--lr","0.001","--name","two words"],"params":{},"source":"configs:5","trial":2}'
  assert_equal "$(find "$SCRATCH" -mindepth 1 | wc -l)" 0
}

@test "--wait with --dry-run prints the script and calls nothing" {
  dry "${BASE[@]}" --wait
  assert_line "#!/bin/bash"
  assert_file_not_exists "$STUB_SBATCH_LOG"
}

@test "an option given twice with the same value is accepted" {
  dry "${BASE[@]}" -g 2 --gpus=2 -N 1 --nodes 1
  assert_line "#SBATCH --gres=gpu:2"
}

@test "-- ends the options: the command is taken word for word" {
  run --separate-stderr "$SUBMITTER" --list-trials -- python train.py -g 3 'a b' '$(x)' "it's"
  assert_success
  assert_output '{"argv":["python","train.py","-g","3","a b","$(x)","it'\''s"],"params":{},"source":"configs:1","trial":0}'
  dry -- python train.py -g 3
  assert_line "#SBATCH --gres=gpu:1"
  assert_line "# Trials: 1."
}

@test "-h and --help print the usage and exit 0, without SCRATCH" {
  local spelling
  unset SCRATCH
  for spelling in -h --help; do
    run --separate-stderr "$SUBMITTER" "$spelling"
    assert_success
    assert_line --index 0 "Usage: job_submitter.sh [options] [-- COMMAND [ARG...]]"
    assert_equal "$stderr" ""
  done
}

@test "--help wins over other options, even bad ones later validated" {
  run --separate-stderr "$SUBMITTER" -g 99 --help
  assert_success
  assert_line --index 0 --partial "Usage:"
}

@test "--version" {
  local version
  version=$(sed -n 's/^HPC_VERSION="\(.*\)"$/\1/p' "$REPO_ROOT/hpc_files/lib/options.sh")
  [[ -n "$version" ]] || fail "no HPC_VERSION in lib/options.sh"
  run --separate-stderr "$SUBMITTER" --version
  assert_success
  assert_output "job_submitter.sh $version"
}

@test "--help lists every spelling in OPTION_SETTING and FLAG_SETTING" {
  local spelling missing=()
  # shellcheck source=../../../hpc_files/lib/options.sh
  source "$REPO_ROOT/hpc_files/lib/options.sh"
  run "$SUBMITTER" --help
  assert_success
  for spelling in "${!OPTION_SETTING[@]}" "${!FLAG_SETTING[@]}"; do
    grep -qE -- "(^|[ ,])${spelling}([ ,=]|$)" <<<"$output" || missing+=("$spelling")
  done
  ((${#missing[@]} == 0)) || fail "not in --help: ${missing[*]}"
  # Every spelling is in one table only.
  for spelling in "${!FLAG_SETTING[@]}"; do
    [[ -z "${OPTION_SETTING[$spelling]:-}" ]] || fail "$spelling is both a flag and an option"
  done
}

@test "--help says which python expands trials without HPC_PYTHON: login_python's order" {
  local text
  run "$SUBMITTER" --help
  assert_success
  text=$(tr -s ' \n' ' ' <<<"$output")
  [[ "$text" == *"HPC_PYTHON (the python that expands trials and sweeps on this machine; default: the --venv's python, else the project's .venv, else python3)"* ]] ||
    fail "--help does not give login_python's order: $text"
}

@test "--help shows the real defaults" {
  # shellcheck source=../../../hpc_files/lib/options.sh
  source "$REPO_ROOT/hpc_files/lib/options.sh"
  run "$SUBMITTER" --help
  assert_success
  assert_line --regexp "^  -g, --gpus G .*\(default: $DEFAULT_GPUS\)$"
  assert_line --regexp "^  -c, --cpus, --cpu C .*\(default: $DEFAULT_CPUS\)$"
  assert_line --regexp "^  -m, --mem-per-gpu SIZE .*\(default: $DEFAULT_MEM_PER_GPU\)$"
  assert_line --regexp "\(default: $DEFAULT_TIME\)$"
  assert_line --regexp "^ +nodes per run \(default: $DEFAULT_NODES\)$"
  assert_line --regexp "^ +below 70 s; default: $DEFAULT_SIGNAL_LEAD\)$"
  assert_line --regexp "^  --max-requeues N .*\(default: $DEFAULT_MAX_REQUEUES\)$"
}

@test "relative files: from the current directory, else from the project (the seed's 'cd hpc_files' workflow)" {
  cd "$REPO_ROOT/hpc_files"
  dry --sweep sweeper.yml --trials 2
  assert_output --partial '#SBATCH --array='
  dry -C experiment_configurations.txt
  # The current directory's file wins over the project's.
  cd "$BATS_TEST_TMPDIR"
  printf 'python here.py\n' >experiment_configurations.txt
  run --separate-stderr "$SUBMITTER" --list-trials -C experiment_configurations.txt </dev/null
  assert_success
  assert_output --partial '"argv":["python","here.py"]'
  refuse "--sweep file 'nowhere.yml' does not exist" -- --sweep nowhere.yml
}

@test "--wandb-sync login|none: refused otherwise (exit 2, one line)" {
  refuse "--wandb-sync expects one of: login none; got 'online'" -- --wandb-sync online -C "$ONE_LINE"
  refuse "--wandb-sync expects one of: login none; got '\$(touch x)'" -- --wandb-sync '$(touch x)' -C "$ONE_LINE"
  refuse "--wandb-sync expects a value" -- -C "$ONE_LINE" --wandb-sync
}

# wandb_sync_lines ARG...: the --dry-run script's --wandb-sync lines.
wandb_sync_lines() {
  "$SUBMITTER" --dry-run -e live -C "$ONE_LINE" --venv "$FAKE_VENV" "$@" </dev/null |
    grep -E '^export (WANDB_MODE|HPC_WANDB_SYNC_DIR|WANDB__TRANSACTION_LOG_FLUSH_INTERVAL)='
}

@test "--wandb-sync login: the job runs W&B offline and gets the experiment's trigger folder; the site's wandb_sync is the default, the command line wins" {
  run wandb_sync_lines --wandb-sync login
  assert_success
  assert_output "export WANDB_MODE=offline
export HPC_WANDB_SYNC_DIR='$SCRATCH/$PROJECT/live/wandb_osh'
export WANDB__TRANSACTION_LOG_FLUSH_INTERVAL=2"
  run wandb_sync_lines
  assert_output ''
  local site="$BATS_TEST_TMPDIR/a site/live.conf"
  mkdir -p "${site%/*}"
  printf 'wandb_sync = login\n' >"$site"
  run wandb_sync_lines --site "$site"
  assert_line "export HPC_WANDB_SYNC_DIR='$SCRATCH/$PROJECT/live/wandb_osh'"
  run wandb_sync_lines --site "$site" --wandb-sync none
  assert_output ''
  # Its own line beats the site's env (cedar sets WANDB_MODE=offline, another site online).
  printf 'wandb_sync = login\nenv = WANDB_MODE=online\n' >"$site"
  run bash -c '"$1" --dry-run -e live -C "$2" --venv "$3" --site "$4" </dev/null | grep "^export WANDB_MODE="' _ \
    "$SUBMITTER" "$ONE_LINE" "$FAKE_VENV" "$site"
  assert_output "export WANDB_MODE=online
export WANDB_MODE=offline"
}

@test "--wandb-sync login: the submission report says how to start the login-node syncer under tmux" {
  run --separate-stderr "$SUBMITTER" -e live -C "$ONE_LINE" --venv "$FAKE_VENV" --wandb-sync login </dev/null
  assert_success
  assert_line "  W&B live:   tmux new -d -s sync 'bash $(printf '%q' "$REPO_ROOT/hpc_files/wandb_sync.sh") live'"
}
