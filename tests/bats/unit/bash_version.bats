#!/usr/bin/env bats
# Which bash runs the suites. `make bats-unit-bash42` and `make test-portability`
# set HPC_TEST_EXPECT_BASH=4.2 with bash 4.2 first on PATH; these checks prove
# that bats itself, `bash` from PATH and a `#!/usr/bin/env bash` script all run
# under that version (and not the system's bash). Skipped when the variable is unset.

load '../test_helper'

# Every check needs the expected version, as "4.2".
setup() {
  [[ -n "${HPC_TEST_EXPECT_BASH:-}" ]] || skip "HPC_TEST_EXPECT_BASH is not set"
}

@test "bats runs under the expected bash" {
  assert_equal "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}" "$HPC_TEST_EXPECT_BASH"
}

@test "bash from PATH is the expected bash" {
  run bash -c 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"'
  assert_success
  assert_output "$HPC_TEST_EXPECT_BASH"
}

@test "a '#!/usr/bin/env bash' script runs under the expected bash" {
  local script="$BATS_TEST_TMPDIR/version.sh"
  printf '#!/usr/bin/env bash\necho "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"\n' >"$script"
  chmod +x "$script"
  run "$script"
  assert_success
  assert_output "$HPC_TEST_EXPECT_BASH"
}
