#!/usr/bin/env bash
# Runs a command with GNU bash 4.2 (the shell of EL7-era login and compute
# nodes) first on PATH, and HPC_TEST_EXPECT_BASH=4.2 so the suites check that
# they really run under it (tests/bats/unit/bash_version.bats):
#   tools/with_bash42.sh bats -r tests/bats/unit
# The folder is $BASH42_DIR, else ../shared/tools/bash-4.2 beside the
# repository, else beside the repository it was cloned from (a CI clone in
# /tmp); it must hold an executable `bash` that reports 4.2 (its README says
# how to build one from source where the binary does not run). With
# BASH42_OPTIONAL=1 (make test), a machine without it skips the command with a
# warning instead of failing.
set -euo pipefail

die() {
  echo "with_bash42.sh: error: $*" >&2
  exit 1
}

# bash42_dir REPO: the first folder that holds bash 4.2's binary, or nothing.
bash42_dir() {
  local repo=$1 origin candidate
  local -a candidates=()
  if [[ -n "${BASH42_DIR:-}" ]]; then
    candidates=("$BASH42_DIR")
  else
    candidates=("$repo/../shared/tools/bash-4.2")
    origin=$(git -C "$repo" config --get remote.origin.url 2>/dev/null) || origin=""
    [[ "$origin" != /* ]] || candidates+=("$origin/../shared/tools/bash-4.2")
  fi
  for candidate in "${candidates[@]}"; do
    if [[ -x "$candidate/bash" ]]; then
      printf '%s' "$candidate"
      return 0
    fi
  done
}

main() {
  local repo dir version
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dir=$(bash42_dir "$repo")
  if [[ -z "$dir" ]]; then
    if [[ "${BASH42_OPTIONAL:-}" == 1 ]]; then
      echo "with_bash42.sh: warning: no GNU bash 4.2 here (BASH42_DIR, ../shared/tools/bash-4.2); skipped: $*" >&2
      exit 0
    fi
    die "no executable bash in ${BASH42_DIR:-../shared/tools/bash-4.2 beside the repository or its origin} (set BASH42_DIR to a folder holding GNU bash 4.2)"
  fi
  dir="$(cd "$dir" && pwd)"
  # shellcheck disable=SC2016 # expanded by the bash under test, not this one
  version="$("$dir/bash" -c 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"')" ||
    die "'$dir/bash' does not run here (rebuild it from source: see $dir/README.md)"
  [[ "$version" == 4.2 ]] || die "'$dir/bash' is bash $version, expected 4.2"
  (($# > 0)) || die "usage: with_bash42.sh COMMAND [ARG...]"
  PATH="$dir:$PATH" HPC_TEST_EXPECT_BASH=4.2 exec "$@"
}

main "$@"
