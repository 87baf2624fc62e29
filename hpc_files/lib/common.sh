# shellcheck shell=bash
# Messages and small helpers shared by every step of job_submitter.sh.
# Sourced; defines functions only.

# What the compute nodes read too (job states, the tarball's .meta): in
# node/, which every submission folder copies.
# shellcheck source=../node/shared.sh
source "${BASH_SOURCE[0]%/*}/../node/shared.sh"

# One prefix for every message on stderr.
HPC_PROG="${HPC_PROG:-job_submitter.sh}"

# one_line TEXT: TEXT with newlines, carriage returns and tabs shown as \n,
# \r, \t, so a message quoting a hostile value stays one line.
one_line() {
  local text="$*"
  text=${text//$'\n'/\\n}
  text=${text//$'\r'/\\r}
  text=${text//$'\t'/\\t}
  printf '%s' "$text"
}

# usage_error MESSAGE: bad input from the user; nothing was submitted. Exit 2.
usage_error() {
  printf '%s: error: %s\n' "$HPC_PROG" "$(one_line "$*")" >&2
  exit 2
}

# die MESSAGE: a runtime failure (a command failed, a file could not be written). Exit 1.
die() {
  printf '%s: error: %s\n' "$HPC_PROG" "$(one_line "$*")" >&2
  exit 1
}

warn() {
  printf '%s: warning: %s\n' "$HPC_PROG" "$*" >&2
}

info() {
  printf '%s: %s\n' "$HPC_PROG" "$*" >&2
}

# Helpers that compute a string print it, or store it in the variable named by
# an optional last argument: 'to_decimal "$x" x' costs no subshell, where
# 'x=$(to_decimal "$x")' forks one (the submitter runs dozens of these). The
# variable must not be one of the helper's own locals.

# emit VAR VALUE: store VALUE in VAR, or print it when VAR is empty.
emit() {
  if [[ -n "$1" ]]; then
    printf -v "$1" '%s' "$2"
  else
    printf '%s' "$2"
  fi
}

# shell_quote WORD...: each word quoted for a shell, joined by spaces. Unlike
# printf %q it keeps printable text readable ('a b' rather than a\ b) and is
# stable across bash versions, which the golden files need.
shell_quote() {
  local quoted
  shell_quote_to quoted "$@"
  printf '%s' "$quoted"
}

# shell_quote_to VAR WORD...: shell_quote's text, stored in VAR.
shell_quote_to() {
  local into=$1 word out="" sep="" quote="'" escaped="'\\''"
  shift
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then
      out+="$sep$word"
    else
      # Outside double quotes and with quoted operands, this replacement
      # means the same on bash 4.2 as on 4.3+ (where a double-quoted one differs).
      word=${word//"$quote"/"$escaped"}
      out+="$sep'$word'"
    fi
    sep=" "
  done
  printf -v "$into" '%s' "$out"
}

# is_uint VALUE: a whole number (no sign, no spaces, not empty).
is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

# to_decimal VALUE [VAR]: strip leading zeros so $((...)) never reads octal.
to_decimal() {
  local digits=${1#"${1%%[!0]*}"}
  emit "${2:-}" "${digits:-0}"
}

# Temporary files removed when job_submitter.sh exits, whatever the outcome.
HPC_CLEANUP_PATHS=()

register_cleanup() {
  HPC_CLEANUP_PATHS+=("$1")
}

run_cleanup() {
  ((${#HPC_CLEANUP_PATHS[@]} == 0)) || rm -rf -- "${HPC_CLEANUP_PATHS[@]}"
}
