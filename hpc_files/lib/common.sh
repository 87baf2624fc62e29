# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034/SC2154: the opt_*, site_* and plan_* variables are shared by the
# libraries that job_submitter.sh sources together; shellcheck -x on
# job_submitter.sh checks them as a whole.)
# Messages and small helpers shared by every step of job_submitter.sh.
# Sourced; defines functions only.

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

# shell_quote WORD...: each word quoted for a shell, joined by spaces. Unlike
# printf %q it keeps printable text readable ('a b' rather than a\ b) and is
# stable across bash versions, which the golden files need.
shell_quote() {
  local word out="" sep=""
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then
      out+="$sep$word"
    else
      out+="$sep'${word//\'/\'\\\'\'}'"
    fi
    sep=" "
  done
  printf '%s' "$out"
}

# is_uint VALUE: a whole number (no sign, no spaces, not empty).
is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

# to_decimal VALUE: strip leading zeros so $((...)) never reads octal.
to_decimal() {
  local value=$1
  value="${value#"${value%%[!0]*}"}"
  printf '%s' "${value:-0}"
}

# Temporary files removed when job_submitter.sh exits, whatever the outcome.
HPC_CLEANUP_PATHS=()

register_cleanup() {
  HPC_CLEANUP_PATHS+=("$1")
}

run_cleanup() {
  local path
  for path in ${HPC_CLEANUP_PATHS[@]+"${HPC_CLEANUP_PATHS[@]}"}; do
    [[ -n "$path" ]] && rm -rf -- "$path"
  done
}
