#!/usr/bin/env bash
# Runs a command with GNU bash 4.2 (the shell of EL7-era login and compute
# nodes) first on PATH, and HPC_TEST_EXPECT_BASH=4.2 so the suites check that
# they really run under it (tests/bats/unit/bash_version.bats):
#   tools/with_bash42.sh bats -r tests/bats/unit
# The folder is $BASH42_DIR (default: ../shared/tools/bash-4.2 beside the
# repository), which must hold an executable `bash` that reports 4.2; its
# README says how to build one from source where the binary does not run.
set -euo pipefail

die() {
  echo "with_bash42.sh: error: $*" >&2
  exit 1
}

main() {
  local repo dir version
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dir="${BASH42_DIR:-$repo/../shared/tools/bash-4.2}"
  [[ -x "$dir/bash" ]] || die "no executable bash in '$dir' (set BASH42_DIR to a folder holding GNU bash 4.2)"
  dir="$(cd "$dir" && pwd)"
  # shellcheck disable=SC2016 # expanded by the bash under test, not this one
  version="$("$dir/bash" -c 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"')" ||
    die "'$dir/bash' does not run here (rebuild it from source: see $dir/README.md)"
  [[ "$version" == 4.2 ]] || die "'$dir/bash' is bash $version, expected 4.2"
  (($# > 0)) || die "usage: with_bash42.sh COMMAND [ARG...]"
  PATH="$dir:$PATH" HPC_TEST_EXPECT_BASH=4.2 exec "$@"
}

main "$@"
