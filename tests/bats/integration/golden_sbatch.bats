#!/usr/bin/env bats
# Every golden batch script (tests/bats/fixtures/golden) is accepted by the
# cluster in use: `sbatch --test-only` with its paths made real. Run on SLURM
# 22.05 (make test) and 24.11 (make test-portability), this proves both
# versions accept every flag the submitter renders.
# What this cluster cannot have is mapped, and only that: the dependency names
# two held jobs of this test instead of 123 and 124; cedar's typed GPUs
# (gpu:v100l:4) become gpu:4, and its account (def-pi) one of this cluster's
# (def-lab: a production-shaped cluster refuses an account the user lacks). The site's --constraint=ib is kept and must be
# refused for the feature alone ("Invalid feature specification"), which
# shows the controller parsed the flag.

load '../test_helper'

setup() {
  cluster_test_setup
}

teardown() {
  cancel_test_jobs
}

@test "sbatch --test-only accepts every golden batch script" {
  # The golden files name a scratch folder without a space (so unquoted).
  local dir="$BATS_TEST_TMPDIR/golden" scratch="$BATS_TEST_TMPDIR/golden_scratch"
  local first second file name out failures=""
  mkdir -p "$dir" "$scratch/$project/hpc_outputs"
  # Held jobs to depend on; cancel_test_jobs removes them (their folder is ours).
  first=$(cd "$dir" && sbatch --parsable --hold -o /dev/null --wrap true) || fail "cannot submit a held job"
  second=$(cd "$dir" && sbatch --parsable --hold -o /dev/null --wrap true) || fail "cannot submit a held job"
  for file in "$FIXTURES"/golden/*.sbatch; do
    name=${file##*/}
    sed -e "s|@REPO@|$REPO_ROOT|g; s|@PROJECT@|$project|g; s|/scratch/golden|$scratch|g" \
      -e "s|afterok:123:124|afterok:$first:$second|; s|gpu:v100l:4|gpu:4|; s|--account=def-pi\$|--account=def-lab|" \
      "$file" >"$dir/$name"
    out=$(cd "$BATS_TEST_TMPDIR" && sbatch --test-only "$dir/$name" 2>&1) && continue
    if [[ "$name" == sbatch_arg.sbatch && "$out" == *"Invalid feature specification"* ]]; then
      continue
    fi
    failures+="$name: $out"$'\n'
  done
  [[ -z "$failures" ]] || fail "$(sbatch --version) refused:
$failures"
}
