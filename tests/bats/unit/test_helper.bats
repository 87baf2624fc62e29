#!/usr/bin/env bats
# tests/bats/test_helper.bash: what the cluster tests rely on that runs
# without a cluster (assert_weights_equal, on checkpoints written here).

load '../test_helper'

# The checkpoints, last.pt-shaped ({"model": tensors by name}), written once
# (each torch start costs seconds): a; the same tensors again; one tensor a
# float step apart; one tensor more.
setup_file() {
  [[ -x "$REPO_ROOT/.venv/bin/python" ]] || return 0
  "$REPO_ROOT/.venv/bin/python" -c '
import sys, torch
a = {"w": torch.arange(6.0), "b": torch.zeros(2)}
torch.save({"model": a, "global_step": 3}, sys.argv[1] + "/a.pt")
torch.save({"model": {k: t.clone() for k, t in a.items()}}, sys.argv[1] + "/same.pt")
step = {**a, "b": torch.nextafter(torch.zeros(2), torch.ones(2))}
torch.save({"model": step}, sys.argv[1] + "/one step.pt")
torch.save({"model": {**a, "extra": torch.ones(1)}}, sys.argv[1] + "/more.pt")
' "$BATS_FILE_TMPDIR"
}

setup() {
  [[ -x "$REPO_ROOT/.venv/bin/python" ]] || skip "no .venv (make deps)"
  dir=$BATS_FILE_TMPDIR
}

@test "assert_weights_equal: the same tensors, saved twice, are equal" {
  run assert_weights_equal "$dir/a.pt" "$dir/same.pt"
  assert_success
  assert_output ''
}

@test "assert_weights_equal: a tensor one float step apart fails, naming that tensor alone" {
  run assert_weights_equal "$dir/a.pt" "$dir/one step.pt"
  assert_failure
  assert_output "the weights of $dir/a.pt and $dir/one step.pt differ: b"
}

@test "assert_weights_equal: a tensor more fails, naming it" {
  run assert_weights_equal "$dir/a.pt" "$dir/more.pt"
  assert_failure
  assert_output --partial 'differ: tensors in one only: extra'
}

@test "assert_weights_equal: a missing file fails, naming both" {
  run assert_weights_equal "$dir/a.pt" "$dir/none.pt"
  assert_failure
  assert_output --partial "could not read the weights of $dir/a.pt and $dir/none.pt"
}
