#!/usr/bin/env bats
# job_submitter.sh options added or changed by issue 13: --pass-local-rank's
# spellings, lowercase memory suffixes, --modules '' clearing the site's.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  BASE=(-C "$ONE_LINE")
}

# dry ARG...: job_submitter.sh --dry-run ARG... succeeds; output is the script.
dry() {
  run --separate-stderr "$SUBMITTER" --dry-run "$@"
  assert_success
}

@test "--pass-local-rank=underscore and =hyphen are accepted with -W torchrun" {
  dry "${BASE[@]}" -W torchrun --pass-local-rank=underscore
  assert_line "export HPC_PASS_LOCAL_RANK=underscore"
  dry "${BASE[@]}" -W torchrun --pass-local-rank=hyphen
  assert_line "export HPC_PASS_LOCAL_RANK=hyphen"
}

@test "--pass-local-rank=other is refused naming the spellings" {
  refuse "--pass-local-rank expects hyphen (--local-rank=N) or underscore (--local_rank=N), got 'dash'" -- "${BASE[@]}" -W torchrun --pass-local-rank=dash
}

@test "--help names both local-rank spellings" {
  run "$SUBMITTER" --help
  assert_success
  assert_output --partial "--pass-local-rank=underscore|hyphen"
  assert_output --partial "--local_rank=N"
}

@test "-m takes lowercase suffixes as SLURM does: 10g is 10G" {
  dry "${BASE[@]}" -m 10G
  local upper=$output
  dry "${BASE[@]}" -m 10g
  assert_equal "$output" "$upper"
  dry "${BASE[@]}" -m 512m
  assert_line --partial "--mem=512M"
}

@test "--modules '' clears the site's modules" {
  local site="$BATS_TEST_TMPDIR/site.conf"
  printf 'modules = cuda/12.1 python/3.11\n' >"$site"
  dry "${BASE[@]}" --site "$site"
  assert_line --partial "module load cuda/12.1 python/3.11"
  dry "${BASE[@]}" --site "$site" --modules ''
  refute_output --partial "module load"
  dry "${BASE[@]}" --site "$site" --modules=
  refute_output --partial "module load"
}

@test "an empty value is still refused for other options" {
  refuse "--partition expects a value, got an empty string" -- "${BASE[@]}" --partition ''
}
