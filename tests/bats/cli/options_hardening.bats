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
  assert_line --partial "export HPC_PASS_LOCAL_RANK="
  dry "${BASE[@]}" -W torchrun --pass-local-rank=hyphen
  assert_line --partial "export HPC_PASS_LOCAL_RANK="
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
