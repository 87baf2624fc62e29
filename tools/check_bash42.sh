#!/usr/bin/env bash
# Fails on bash constructs newer than bash 4.2 (EL7-era login and compute
# nodes) in the project's shell files and bats tests (`make lint` runs it):
#   tools/check_bash42.sh        prints each finding as FILE:LINE: what, exits 1
# Files: the shell files of tools/shell_files.sh and the tracked .bats files,
# except bench/ (benchmarks run on the development machine and read
# $EPOCHREALTIME, bash 5.0, for microsecond timestamps on purpose).
# What it checks:
#   1. Every such shell file and every .bats file (with its
#      `@test "..." {` lines made into function headers) parses with
#      `bash -n` under bash 4.2 ($BASH42_DIR, see tools/with_bash42.sh).
#   2. Constructs that parse under 4.2 but fail when they run, found by grep
#      (lines that start with '#' are skipped; builtins only where they
#      start a command, so 'job_submitter.sh --site local -n 2' is no nameref):
#        ${x@Q} and the other @ transformations (4.4, some 5.1)
#        declare/local/typeset -n, namerefs (4.3)
#        mapfile/readarray -d (4.4)
#        wait -n (4.3), wait -f (5.0), wait -p (5.1)
#        a negative subscript in an assignment or unset, a[-1]=x (4.3);
#          reading ${a[-1]} works on 4.2 and is allowed
#        [[ -v name[...] ]], -v on an array element (4.3)
#        [[ -R name ]] (4.3)
#        local - (4.4)
#        $EPOCHSECONDS, $EPOCHREALTIME, $SRANDOM, $BASH_ARGV0 (5.0, 5.1)
#        shopt options added after 4.2 (inherit_errexit, localvar_inherit, ...)
# What it does not check: "${a[@]}" of an empty array under set -u (an error
# before 4.4) cannot be told from a grep; the unit and CLI suites run under
# 4.2 (make bats-unit-bash42) to catch it, and the integration suite with
# make test-portability.
set -euo pipefail

# pattern<TAB>what: ERE for grep -E.
# shellcheck disable=SC2016 # the $ and ${ here are regular expressions, not expansions
readonly PATTERNS='\$\{[#!]?[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?@[A-Za-z]\}	${x@...} transformation (bash 4.4+)
(^|[;&|({]|\b(then|do|else))[[:space:]]*(declare|local|typeset)[[:space:]]+(-[A-Za-z]+[[:space:]]+)*-[A-Za-z]*n[A-Za-z]*\b	nameref declare/local -n (bash 4.3)
(^|[;&|({]|\b(then|do|else))[[:space:]]*(mapfile|readarray)\b[^|;&]*[[:space:]]-[A-Za-z]*d\b	mapfile -d (bash 4.4)
(^|[;&|({]|\b(then|do|else))[[:space:]]*wait[[:space:]]+-[A-Za-z]*[nfp]\b	wait -n/-f/-p (bash 4.3+)
\b[A-Za-z_][A-Za-z0-9_]*\[-[0-9]+\]\+?=	negative subscript assignment (bash 4.3)
(^|[;&|({]|\b(then|do|else))[[:space:]]*unset\b.*\[-[0-9]+\]	unset of a negative subscript (bash 4.3)
-v[[:space:]]+["'\'']?[A-Za-z_][A-Za-z0-9_]*\[	-v on an array element (bash 4.3)
\[\[[^]]*[[:space:]]-R[[:space:]]	[[ -R name ]] (bash 4.3)
(^|[;&|({]|\b(then|do|else))[[:space:]]*local[[:space:]]+-([[:space:]]|;|$)	local - (bash 4.4)
\$\{?(EPOCHSECONDS|EPOCHREALTIME|SRANDOM|BASH_ARGV0)\b	variable added in bash 5.x
(^|[;&|({]|\b(then|do|else))[[:space:]]*shopt\b.*\b(globasciiranges|inherit_errexit|localvar_inherit|localvar_unset|assoc_expand_once|progcomp_alias|patsub_replacement|noexpand_translation|varredir_close|execfail_errexit)\b	shopt option newer than bash 4.2'

die() {
  echo "check_bash42.sh: error: $*" >&2
  exit 2
}

main() {
  local repo bash42 file pattern what hits line failed=0
  local -a shell_files=() bats_files=() shell_files_to_parse=() bats_files_to_parse=()
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  cd "$repo"
  # Empty when BASH42_OPTIONAL=1 and there is none: the greps still run.
  bash42="$(tools/with_bash42.sh sh -c 'command -v bash')" || die "bash 4.2 is not available (see tools/with_bash42.sh)"

  while IFS= read -r file; do
    case "$file" in
      tools/check_bash42.sh | bench/*) ;;
      *) shell_files+=("$file") ;;
    esac
  done < <(tools/shell_files.sh)
  while IFS= read -r file; do
    [[ -f "$file" && "$file" != bench/* ]] && bats_files+=("$file")
  done < <(git ls-files -co --exclude-standard -- '*.bats')
  shell_files_to_parse=(${shell_files[@]+"${shell_files[@]}"})
  bats_files_to_parse=(${bats_files[@]+"${bats_files[@]}"})

  [[ -n "$bash42" ]] || shell_files_to_parse=() bats_files_to_parse=()
  for file in ${shell_files_to_parse[@]+"${shell_files_to_parse[@]}"}; do
    "$bash42" -n "$file" || { echo "$file: does not parse under bash 4.2"; failed=1; }
  done
  for file in ${bats_files_to_parse[@]+"${bats_files_to_parse[@]}"}; do
    sed -E 's/^[[:space:]]*@test[[:space:]].*\{[[:space:]]*$/bats_test() {/' "$file" |
      "$bash42" -n /dev/stdin 2>&1 | sed "s|/dev/stdin|$file|" | grep . &&
      { echo "$file: does not parse under bash 4.2"; failed=1; }
  done

  while IFS=$'\t' read -r pattern what; do
    hits="$(grep -nHE -- "$pattern" ${shell_files[@]+"${shell_files[@]}"} ${bats_files[@]+"${bats_files[@]}"} |
      grep -vE '^[^:]+:[0-9]+:[[:space:]]*#')" || continue
    while IFS= read -r line; do printf '%s    <- %s\n' "$line" "$what"; done <<<"$hits"
    failed=1
  done <<<"$PATTERNS"

  ((failed == 0)) || { echo "check_bash42.sh: constructs newer than bash 4.2 found (see above)" >&2; return 1; }
  if [[ -n "$bash42" ]]; then
    echo "check_bash42.sh: $((${#shell_files[@]} + ${#bats_files[@]})) files parse under bash 4.2, no newer constructs"
  else
    echo "check_bash42.sh: no newer constructs in $((${#shell_files[@]} + ${#bats_files[@]})) files (not parsed: no bash 4.2 here)"
  fi
}

main "$@"
