#!/usr/bin/env bats
# hpc_files/node/local_rank_shim.sh: one torchrun worker with its local rank
# appended (--pass-local-rank), run directly with a fake python on PATH.

load '../test_helper'

SHIM="$REPO_ROOT/hpc_files/node/local_rank_shim.sh"

setup() {
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\nprintf "python"\nprintf " [%%s]" "$@"\necho\n' >"$bin/python"
  chmod +x "$bin/python"
  export PATH="$bin:$PATH"
  unset HPC_PASS_LOCAL_RANK
}

@test "a script: python SCRIPT ARGS --local-rank=N" {
  LOCAL_RANK=3 run "$SHIM" train.py --lr 0.1 'two words'
  assert_success
  assert_output "python [train.py] [--lr] [0.1] [two words] [--local-rank=3]"
}

@test "-m MODULE, and the underscore spelling for older programs" {
  LOCAL_RANK=1 HPC_PASS_LOCAL_RANK=underscore run "$SHIM" -m pkg.train --x
  assert_output "python [-m] [pkg.train] [--x] [--local_rank=1]"
}

@test "--no-python PROGRAM: the program itself, not python" {
  LOCAL_RANK=0 run "$SHIM" --no-python printf '[%s]' a
  assert_output "[a][--local-rank=0]"
}

@test "without LOCAL_RANK (not under torchrun): fails and says torchrun sets it" {
  unset LOCAL_RANK
  run --separate-stderr "$SHIM" train.py
  assert_failure
  assert_regex "$stderr" "LOCAL_RANK: torchrun sets LOCAL_RANK"
}
