#!/usr/bin/env bats
# hpc_files/results.sh on fabricated submission folders, logs and metrics.csv
# (no cluster): seeds grouped as mean ± std, a failed trial kept and named,
# sorting, --no-group, --csv, --plot, --curves (and --run), and refusals.

load '../test_helper'
load 'cli_helper'

RESULTS="$REPO_ROOT/hpc_files/results.sh"

setup() {
  fabricated_submissions
}

@test "-h and --help print the usage and exit 0, without SCRATCH; every parser option is in it" {
  local spelling opts opt
  for spelling in -h --help; do
    run --separate-stderr env -u SCRATCH "$RESULTS" "$spelling"
    assert_success
    assert_line --index 0 --partial 'usage: results.sh EXP|JOBID [--sort METRIC[:max|min]]'
  done
  opts=$(sed -n '/^def cmd_results/,/^def /p' "$REPO_ROOT/hpc_files/hpc_tools/results.py" | grep -oE '"--?[a-z][a-z-]*"' | tr -d '"' | sort -u)
  [[ -n "$opts" ]] || fail "no options found in cmd_results"
  for opt in $opts; do
    assert_output --regexp "(^|[ ,])$opt([ ,=]|$)"
  done
}

@test "seeds grouped as mean ± std with n, sorted by the sweep's metric, the failed trial kept with its exit code" {
  run --separate-stderr "$RESULTS" grid --metrics test_acc
  assert_success
  assert_equal "$stderr" ""
  assert_output "grid  $SCRATCH/$project/grid/20261123-120000-new2
8 trial(s); sorted by test_acc (max)
trials  hidden  lr    n  state                          test_acc        best test_acc
2,3     32      0.01  2  finished, requeued 1x          0.91 ± 0.01414  0.91 ± 0.01414
0,1     16      0.01  2  finished                       0.81 ± 0.01414  0.81 ± 0.01414
4,5     16      0.1   1  1 finished, 1 failed (exit 3)  0.7             0.7
6,7     32      0.1   2  finished                       0.62 ± 0.02828  0.62 ± 0.02828"
}

@test "--no-group: one row per trial; --sort METRIC:min reverses (and best is then the lowest); a loss sorts ascending by itself" {
  run "$RESULTS" grid --no-group --sort test_acc:min -m test_acc
  assert_success
  assert_line --index 2 --regexp '^trial +hidden +lr +seed +state +test_acc +best test_acc$'
  assert_line --index 3 --regexp '^6 +32 +0\.1 +0 +finished +0\.6 +0\.55$'
  assert_line --index 9 --regexp '^3 +32 +0\.01 +1 +finished +0\.92 +0\.87$'
  # The failed trial stays, after the others.
  assert_line --index 10 --regexp '^5 +16 +0\.1 +1 +failed \(exit 3\) +0\.1 +0\.05$'
  run "$RESULTS" grid --no-group --sort=test_loss -m test_acc
  assert_line --index 1 '8 trial(s); sorted by test_loss (min)'
  assert_line --index 3 --regexp '^3 '
}

@test "--csv and --plot write their files (paths with spaces); the PNG is a non-empty PNG" {
  local out="$BATS_TEST_TMPDIR/out dir"
  mkdir -p "$out"
  run "$RESULTS" grid --csv "$out/r.csv" --plot="$out/r.png"
  assert_success
  assert_line "wrote $out/r.csv"
  assert_line "wrote $out/r.png"
  run head -n 2 "$out/r.csv"
  assert_line --index 0 'trials,hidden,lr,n,state,train_loss,train_loss_std,best train_loss,best train_loss_std,test_loss,test_loss_std,best test_loss,best test_loss_std,test_acc,test_acc_std,best test_acc,best test_acc_std'
  assert_line --index 1 --regexp '^"2,3",32,0\.01,2,"finished, requeued 1x",0\.19'
  run od -An -c -N 4 "$out/r.png"
  assert_output --regexp '211 +P +N +G'
  (($(stat -c %s "$out/r.png") > 5000)) || fail "PNG too small"
}

@test "--curves writes the trials' training curves; --run draws one run's without SCRATCH; a bad --run path exits 2 with one line" {
  local out="$BATS_TEST_TMPDIR/out dir"
  mkdir -p "$out"
  run --separate-stderr "$RESULTS" grid -m test_acc --curves "$out/c.png"
  assert_success
  assert_equal "$stderr" ""
  assert_line "wrote $out/c.png"
  run od -An -c -N 4 "$out/c.png"
  assert_output --regexp '211 +P +N +G'
  (($(stat -c %s "$out/c.png") > 5000)) || fail "PNG too small"
  run --separate-stderr env -u SCRATCH "$RESULTS" --run "$SCRATCH/$project/single" --curves="$out/r.png"
  assert_success
  assert_output "wrote $out/r.png"
  assert_file_exists "$out/r.png"
  run --separate-stderr "$RESULTS" --run "$out/nope" --curves "$out/x.png"
  assert_failure 2
  assert_output ''
  assert_equal "$stderr" "results.sh: error: --run: no metrics.csv at '$out/nope' or one folder below"
  assert_file_not_exists "$out/x.png"
}

@test "a plain job and a configs-file array (parameters: the words that differ between lines)" {
  run "$RESULTS" single -m test_acc
  assert_success
  assert_line --index 3 --regexp '^0 +finished +0\.75 +0\.75$'
  run "$RESULTS" configs -m test_acc
  assert_success
  assert_line --index 2 --regexp '^trial +lr +state +test_acc +best test_acc$'
  assert_line --index 3 --regexp '^0 +0\.1 +finished +0\.5 +0\.5$'
  assert_line --index 4 --regexp '^1 +0\.01 +stopped \(no end line in its log\) +- +-$'
}

@test "refusals: exit 2, one line on stderr, nothing on stdout, nothing written" {
  local cases=(
    "give the experiment (or job id) to show: results.sh EXP|"
    "unknown option '--bogus' (see --help)|grid;--bogus"
    "--sort: no trial logged 'val_acc' (logged: train_loss, test_loss, test_acc)|grid;--sort;val_acc"
    "--metrics: no trial logged 'nope' (logged: train_loss, test_loss, test_acc)|grid;-m;nope"
    "--csv expects a value|grid;--csv"
    "--csv expects a file name, got ''|grid;--csv="
    "--curves expects a value|grid;--curves"
    "no experiment or job id '\$(touch x)' under $SCRATCH/$project (experiments: configs, grid, single)|\$(touch x)"
  )
  local case expected args
  cd "$BATS_TEST_TMPDIR"
  for case in "${cases[@]}"; do
    expected=${case%%|*}
    IFS=";" read -ra args <<<"${case#*|}"
    run --separate-stderr "$RESULTS" ${args[@]+"${args[@]}"}
    assert_failure 2
    assert_output ''
    assert_equal "$stderr" "results.sh: error: $expected"
  done
  assert_file_not_exists x
}
