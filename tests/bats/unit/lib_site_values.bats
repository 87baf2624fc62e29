#!/usr/bin/env bats
# hpc_files/lib/site.sh: comments and typed values in site profiles. Hostile
# values must be refused (exit 2, one line naming file, line, key and what is
# accepted) and never evaluated.

load '../test_helper'
load 'site_helper'

setup() {
  site_setup
  export PWNED="$BATS_TEST_TMPDIR/pwned"
}

# refused LINE ACCEPTED: a profile holding LINE (as line 2) is refused with
# exit 2 and one message naming file, line, key and ACCEPTED; nothing ran.
refused() {
  local key
  key=$(printf '%s' "$1" | sed 's/[[:space:]]*=.*//')
  site '# first line' "$1"
  in_libs 'parse_options --site "$SITE_FILE"; load_site; echo loaded'
  assert_failure 2
  assert_output ''
  assert_equal "$(printf '%s\n' "$stderr" | wc -l)" 1
  [[ "$stderr" == "job_submitter.sh: error: $SITE_FILE:2: $key expects $2, got '"* ]] ||
    fail "unexpected message: $stderr"
  assert_file_not_exists "$PWNED"
}

@test "a numeric key holding code is refused, not evaluated" {
  refused 'max_cpus_per_node = SECONDS[$(touch "$PWNED")]' 'a whole number'
  refused 'max_gpus_per_node = a[$(touch "$PWNED")]' 'a whole number'
  refused 'max_nodes = 1+1' 'a whole number'
  refused 'array_throttle = -3' 'a whole number'
}

@test "array_throttle is what --array-throttle accepts, as it defaults that option" {
  refused 'array_throttle = 0' 'a whole number from 1 to 100000'
  refused 'array_throttle = 100001' 'a whole number from 1 to 100000'
  site 'array_throttle = 0100000'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s" "$site_array_throttle"'
  assert_success
  assert_output 100000
}

@test "numbers with leading zeros are read as decimal" {
  site 'max_cpus_per_node = 08' 'max_gpus_per_node = 010'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "%s\n" "$site_max_cpus_per_node" "$site_max_gpus_per_node"'
  assert_success
  assert_equal "$output" $'8\n10'
}

@test "inline comments are not part of values (the docs' example)" {
  site 'account = my-account        # default --account' \
    'partition = gpu   # default --partition' \
    'provides_tmpdir = no	# tab before the comment' \
    'sbatch = --constraint=ib   # repeatable, one option per line' \
    'env = NCCL_SOCKET_IFNAME=^docker0,lo # comment' \
    'max_nodes = 4 # comment' \
    'env = TAG=a#b' \
    'command = echo hi # comment'
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    printf "%s\n" "$site_account" "$site_partition" "$site_provides_tmpdir" "$site_max_nodes" "${site_sbatch[@]}" "${site_env[@]}" "${site_command[@]}"'
  assert_success
  assert_equal "$output" 'my-account
gpu
no
4
--constraint=ib
NCCL_SOCKET_IFNAME=^docker0,lo
TAG=a#b
echo hi'
}

@test "env must be NAME=value with a valid NAME" {
  refused 'env = NOEQ' "NAME=value with NAME of letters, digits and '_' (not a digit first)"
  refused 'env = A B=1' "NAME=value with NAME of letters, digits and '_' (not a digit first)"
  refused 'env = 1A=1' "NAME=value with NAME of letters, digits and '_' (not a digit first)"
  refused 'env = $(touch "$PWNED")=1' "NAME=value with NAME of letters, digits and '_' (not a digit first)"
}

@test "yes/no/auto, runtimes, names, modules, paths and sbatch options are checked" {
  refused 'provides_tmpdir = maybe' 'yes, no or auto'
  refused 'container_runtime = docker' 'singularity or apptainer'
  refused 'wandb_sync = $(touch "$PWNED")' 'login or none'
  refused 'wandb_sync = yes' 'login or none'
  refused 'account = a b' "names of letters, digits, '.', '_' and '-' (one account)"
  # The default of --account, which takes one account.
  refused 'account = a,b' "names of letters, digits, '.', '_' and '-' (one account)"
  refused 'partition = $(touch "$PWNED")' "names of letters, digits, '.', '_' and '-', separated by commas"
  refused 'gpu_types = v100;a100' "names of letters, digits, '.', '_' and '-', separated by commas"
  refused 'modules = cuda/12 $(touch "$PWNED")' "module names (letters, digits, '_', '.', '/', '+', '-') separated by spaces"
  refused 'tmpdir_base = /tmp/"$(touch "$PWNED")"' "a path of letters, digits, spaces and '_./+@:-', which may name \$USER (relative: to slurm.conf's folder)"
  refused 'tmpdir_base = ../$(touch "$PWNED")' "a path of letters, digits, spaces and '_./+@:-', which may name \$USER (relative: to slurm.conf's folder)"
  refused 'sbatch = constraint=ib' "an sbatch option starting with '-'"
  # the submitter's command line beats it at submission, a later sbatch of the script obeys it
  refused 'sbatch = --time=5' "an sbatch option the submitter does not set itself (use -t/--time)"
  # a later #SBATCH line wins: the job's layout would not be the one the submitter planned
  refused 'sbatch = --nodes=2' "an sbatch option the submitter does not set itself (use -N/--nodes)"
  refused 'sbatch = --gres=gpu:4' "an sbatch option the submitter does not set itself (use -g/--gpus and -G/--gpu-type)"
  refused 'sbatch = --mem-per-cpu=4G' "an sbatch option the submitter does not set itself (use -m/--mem-per-gpu, or --mem=SIZE for the memory per node)"
  refused 'sbatch = -p gpu' "an sbatch option the submitter does not set itself (use 'partition = NAME' in the profile, or -p/--partition)"
  refused 'sbatch = --account=x' "an sbatch option the submitter does not set itself (use 'account = NAME' in the profile, or -a/--account)"
}

@test "good typed values are kept as written" {
  site 'tmpdir_base = /scratch-ssd/$USER/x' 'tmpdir_base = /local ssd/${USER}' 'partition = gpu,cpu' \
    'modules = StdEnv/2023 python/3.11' 'container_runtime = apptainer' 'provides_tmpdir = auto'
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    printf "%s\n" "$site_tmpdir_base" "$site_partition" "$site_modules" "$site_container_runtime" "$site_provides_tmpdir"'
  assert_success
  assert_equal "$output" '/local ssd/${USER}
gpu,cpu
StdEnv/2023 python/3.11
apptainer
auto'
}

@test "an empty or odd key is refused as unknown" {
  site ' = value'
  in_libs 'parse_options --site "$SITE_FILE"; load_site'
  assert_failure 2
  [[ "$stderr" == "job_submitter.sh: error: $SITE_FILE:1: unknown key ''"* ]] || fail "$stderr"
  site 'a[$(touch "$PWNED")] = 1'
  in_libs 'parse_options --site "$SITE_FILE"; load_site'
  assert_failure 2
  assert_file_not_exists "$PWNED"
}

@test "every shipped profile loads" {
  local conf
  for conf in "$REPO_ROOT"/hpc_files/sites/*.conf; do
    in_libs 'parse_options --site "'"$conf"'"; load_site; echo ok'
    assert_success
    assert_output ok
  done
}

@test "the docs' example profile loads as documented" {
  sed -n '/^account = def-mypi/,/^command = /p' "$REPO_ROOT/docs/sites.md" >"$SITE_FILE"
  [[ -s "$SITE_FILE" ]] || fail "docs/sites.md example not found"
  in_libs 'parse_options --site "$SITE_FILE"; load_site
    printf "%s\n" "$site_account" "$site_partition" "$site_modules" "$site_provides_tmpdir" "$site_tmpdir_base" "$site_gpu_types" "$site_wandb_sync" "${site_env[@]}" "${site_sbatch[@]}" "${site_command[@]}"'
  assert_success
  assert_equal "$output" 'def-mypi
gpu
StdEnv/2023 cuda/12.2
yes
/scratch-ssd
a100,v100
login
NCCL_SOCKET_IFNAME=^docker0,lo
--constraint=ib
export NCCL_DEBUG=INFO'
}

@test "site_env_names lists the names of the env lines, once each, for the container" {
  site 'env = A=1' 'env = B_2=x=y' 'env = A=2'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "[%s]" "$(site_env_names)"'
  assert_success
  assert_output '[A B_2]'
  site 'partition = x'
  in_libs 'parse_options --site "$SITE_FILE"; load_site; printf "[%s]" "$(site_env_names)"'
  assert_output '[]'
}

@test "--site local finds the local cluster's slurm.conf when SLURM_CONF is unset" {
  local toolkit="$BATS_TEST_TMPDIR/tool kit"
  mkdir -p "$toolkit/.cluster/etc"
  cp -r "$REPO_ROOT/hpc_files" "$toolkit/"
  : >"$toolkit/.cluster/etc/slurm.conf"
  unset SLURM_CONF
  in_toolkit "$toolkit" 'parse_options --site local; load_site; printf "%s" "$SLURM_CONF"'
  assert_success
  assert_output "$toolkit/.cluster/etc/slurm.conf"
  # A SLURM_CONF already set wins.
  SLURM_CONF=/etc/other.conf in_toolkit "$toolkit" 'parse_options --site local; load_site; printf "%s" "$SLURM_CONF"'
  assert_output /etc/other.conf
  # No local cluster made: left unset (sbatch then says what it lacks).
  rm "$toolkit/.cluster/etc/slurm.conf"
  in_toolkit "$toolkit" 'parse_options --site local; load_site; printf "[%s]" "${SLURM_CONF:-}"'
  assert_output '[]'
}

@test "slurm_conf must be a plain path" {
  refused 'slurm_conf = $(touch "$PWNED")/slurm.conf' "a path of letters, digits, spaces and '_./+@:-' (relative: to the toolkit's folder)"
}
