#!/usr/bin/env bats
# hpc_files/lib/site.sh: site profiles, and how they meet the command line.

load '../test_helper'
load 'site_helper'

setup() {
  site_setup
}

@test "scalars, comments, blank lines and spaces around '='" {
  site '# comment' '' '  account   =  def-x  ' 'partition=gpu' 'max_gpus_per_node = 4' '   # indented comment'
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    printf "%s\n" "$site_account" "$site_partition" "$site_max_gpus_per_node" "$site_name"'
  assert_success
  assert_equal "$output" "def-x
gpu
4
$SITE_FILE"
}

@test "repeatable keys accumulate in order; values keep '=' and a literal \$" {
  site 'env = A=1' 'sbatch = --constraint=ib' 'env = B=x=y' 'command = export X="$HOME"' 'sbatch = --exclusive' 'command = echo two'
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    printf "env:%s\n" "${site_env[@]}"; printf "sbatch:%s\n" "${site_sbatch[@]}"; printf "command:%s\n" "${site_command[@]}"'
  assert_success
  assert_equal "$output" 'env:A=1
env:B=x=y
sbatch:--constraint=ib
sbatch:--exclusive
command:export X="$HOME"
command:echo two'
}

@test "a scalar key given twice keeps the last value" {
  site 'partition = a' 'partition = b'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_partition"'
  assert_success
  assert_output b
}

@test "a last line without a newline is read" {
  printf 'partition = last' >"$SITE_FILE"
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_partition"'
  assert_success
  assert_output last
}

@test "defaults for tmpdir mode and base" {
  site 'account = x'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s %s" "$site_provides_tmpdir" "$site_tmpdir_base"'
  assert_success
  assert_output "auto /tmp"
}

@test "a relative tmpdir_base is under the folder of SLURM_CONF, so each local cluster has its own" {
  site 'tmpdir_base = ../local-ssd/$USER'
  SLURM_CONF=/c/one/etc/slurm.conf in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_tmpdir_base"'
  assert_success
  assert_output '/c/one/local-ssd/$USER'
  SLURM_CONF=/c/two/etc/slurm.conf in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_tmpdir_base"'
  assert_output '/c/two/local-ssd/$USER'
}

@test "a relative tmpdir_base without SLURM_CONF: under the profile's slurm_conf (relative: to the toolkit's folder)" {
  site 'tmpdir_base = ./ssd' 'slurm_conf = .elsewhere/etc/slurm.conf'
  unset SLURM_CONF
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_tmpdir_base"'
  assert_success
  assert_output "$REPO_ROOT/.elsewhere/etc/ssd"
}

@test "the shipped local profile puts the mimic folders in the cluster's own folder" {
  SLURM_CONF=/clones/a/.cluster/etc/slurm.conf in_libs 'parse_options --site local; load_site; printf "%s" "$site_tmpdir_base"'
  assert_success
  assert_output /clones/a/.cluster/local-ssd
}

@test "a relative tmpdir_base with no slurm.conf named: exit 2, one line" {
  site 'tmpdir_base = ../local-ssd'
  unset SLURM_CONF
  in_libs 'parse_options --site "$SITE_FILE"; load_site; echo loaded'
  assert_failure 2
  assert_output ''
  assert_equal "$stderr" "job_submitter.sh: error: $SITE_FILE: tmpdir_base '../local-ssd' is relative to the folder of the cluster's slurm.conf, but neither SLURM_CONF nor the profile's slurm_conf names one"
}

@test "a name means hpc_files/sites/NAME.conf; HPC_SITE when --site is not given" {
  HPC_SITE=local in_libs 'parse_options; load_site; printf "%s %s" "$site_file" "$site_partition"'
  assert_success
  assert_output "$REPO_ROOT/hpc_files/sites/local.conf tmpdir"
}

@test "--site wins over HPC_SITE" {
  HPC_SITE=local in_libs 'parse_options --site cedar; load_site; printf "%s %s" "$site_name" "$site_max_gpus_per_node"'
  assert_success
  assert_output "cedar 4"
}

@test "the default site is generic" {
  in_libs 'parse_options; load_site; printf "%s" "$site_name"'
  assert_success
  assert_output generic
}

@test "a personal profile in HPC_SITES_DIR wins over a shipped one of the same name" {
  mkdir -p "$BATS_TEST_TMPDIR/mine"
  printf 'partition = personal\n' >"$BATS_TEST_TMPDIR/mine/local.conf"
  HPC_SITES_DIR="$BATS_TEST_TMPDIR/mine" in_libs 'parse_options --site local; load_site; printf "%s" "$site_partition"'
  assert_success
  assert_output personal
}

@test "an unknown key names the file, the line and the known keys" {
  site 'account = x' 'acount = y'
  in_libs 'parse_options --site "$SITE_FILE"; load_site'
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $SITE_FILE:2: unknown key 'acount' (known: account array_throttle command compute_internet container_runtime env gpu_types max_cpus_per_node max_gpus_per_node max_nodes modules partition provides_tmpdir sbatch slurm_conf tmpdir_base wandb_sync )"
}

@test "a line without '=' names the file and line" {
  site 'account x'
  in_libs 'parse_options --site "$SITE_FILE"; load_site'
  assert_failure 2
  assert_equal "$stderr" "job_submitter.sh: error: $SITE_FILE:1: expected 'key = value', got 'account x'"
}

@test "every shipped profile loads" {
  local f
  for f in "$REPO_ROOT"/hpc_files/sites/*.conf; do
    SITE_FILE=$f in_libs 'parse_options --site "$SITE_FILE"; load_site'
    assert_success
    assert_equal "$stderr" ""
  done
}

@test "load_site reads the profile into site_* only: no option is set from it" {
  site 'account = site-acct' 'partition = p' 'modules = m/1' 'array_throttle = 7'
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    declare -p ${!opt_@} | grep -E "opt_(account|partition|modules|array_throttle)=" || echo none
    printf "%s\n" "$site_account" "$site_partition" "$site_modules" "$site_array_throttle"'
  assert_success
  assert_equal "$output" "none
site-acct
p
m/1
7"
}

@test "read_site_file FILE: a profile alone, with no option parsed" {
  site 'partition = p' 'env = A=1'
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1
    source "$HPC_FILES_DIR/lib/common.sh"
    source "$HPC_FILES_DIR/lib/site.sh"
    read_site_file "$2"
    printf "%s\n" "$site_file" "$site_partition" "${site_env[@]}" "$site_provides_tmpdir" "[$site_account]"' _ "$REPO_ROOT/hpc_files" "$SITE_FILE"
  assert_success
  assert_equal "$output" "$SITE_FILE
p
A=1
auto
[]"
}
