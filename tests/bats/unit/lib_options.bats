#!/usr/bin/env bats
# hpc_files/lib/options.sh: the parser fills opt_* and OPT_GIVEN. Each check
# runs in a fresh bash that sources the libraries at top level.

load '../test_helper'

# parsed ARG...: parse_options ARG...; apply_defaults; print the settings.
parsed() {
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1
    shift
    source "$HPC_FILES_DIR/lib/common.sh"
    source "$HPC_FILES_DIR/lib/options.sh"
    parse_options "$@"
    apply_defaults
    printf "gpus=%s cpus=%s nodes=%s kind=%s time=%s mem=%s exp=%s\n" "$opt_gpus" "$opt_cpus" "$opt_nodes" "$opt_kind" "$opt_time" "$opt_mem_per_gpu" "$opt_exp_name"
    printf "data=%s\n" ${opt_data[@]+"${opt_data[@]}"}
    printf "sbatch_arg=%s\n" ${opt_sbatch_arg[@]+"${opt_sbatch_arg[@]}"}
    printf "command=%s\n" ${opt_command[@]+"${opt_command[@]}"}
    printf "given=%s\n" $(printf "%s\n" "${!OPT_GIVEN[@]}" | LC_ALL=C sort)' _ "$REPO_ROOT/hpc_files" "$@"
}

@test "defaults" {
  parsed
  assert_success
  assert_line "gpus=1 cpus=2 nodes=1 kind=lightning time=00-01:00:00 mem=10G exp=default"
  assert_line "given="
  assert_line "data="
}

@test "short, long and --opt=value spellings" {
  parsed -g 2 --cpus=3 -N 4 --which-distributed torchrun --time=1:00 -m 1G --exp-name=e
  assert_success
  assert_line "gpus=2 cpus=3 nodes=4 kind=torchrun time=1:00 mem=1G exp=e"
  assert_line "given=cpus"
  assert_line "given=nodes"
}

@test "a short option takes no '=value'" {
  parsed -t=1:00
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: unknown option '-t=1:00' (see --help)"
}

@test "-d takes several values after one flag and accumulates" {
  parsed -d a b -g 1 --data c --data=d -d e
  assert_success
  assert_equal "$(grep '^data=' <<<"$output" | tr '\n' ' ')" "data=a data=b data=c data=d data=e "
}

@test "--sbatch-arg accumulates" {
  parsed --sbatch-arg=--a --sbatch-arg='--b=c d'
  assert_success
  assert_line "sbatch_arg=--a"
  assert_line "sbatch_arg=--b=c d"
}

@test "-- keeps every word of the command, options included" {
  parsed -g 2 -- python -g 3 -- 'a b' ''
  assert_success
  assert_line "gpus=2 cpus=2 nodes=1 kind=lightning time=00-01:00:00 mem=10G exp=default"
  assert_equal "$(grep '^command=' <<<"$output")" "command=python
command=-g
command=3
command=--
command=a b
command="
}

@test "a negative number is a value, not an option (so validation can name it)" {
  parsed -g -1
  assert_success
  assert_line --partial "gpus=-1 "
}

@test "a value with '=' in it keeps everything after the first '='" {
  parsed --dependency=afterok:1 --sbatch-arg=--x=y=z
  assert_success
  assert_line "sbatch_arg=--x=y=z"
}

@test "an empty value is refused" {
  parsed -g ''
  assert_failure 2
}

@test "apply_defaults: the configs file is the project's hpc_files/ one, else its root's, unless another source is given" {
  local dir="$BATS_TEST_TMPDIR/proj"
  mkdir -p "$dir/hpc_files"
  defaults_in() {
    # The libraries of this repository, as if they lived in DIR/hpc_files.
    run --separate-stderr bash -c 'set -euo pipefail
      source "$1/lib/common.sh"
      source "$1/lib/options.sh"
      HPC_FILES_DIR=$2
      shift 2
      parse_options "$@"
      project_paths
      apply_defaults
      printf "[%s]" "${opt_configs:-}"' _ "$REPO_ROOT/hpc_files" "$@"
  }
  defaults_in "$dir/hpc_files"
  assert_output "[$dir/experiment_configurations.txt]"
  touch "$dir/hpc_files/experiment_configurations.txt"
  defaults_in "$dir/hpc_files"
  assert_output "[$dir/hpc_files/experiment_configurations.txt]"
  defaults_in "$dir/hpc_files" -- true
  assert_output "[]"
  defaults_in "$dir/hpc_files" --sweep x.yml
  assert_output "[]"
}
