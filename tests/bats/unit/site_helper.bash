# shellcheck shell=bash
# Shared by lib_site*.bats: `load 'site_helper'` after '../test_helper'.
# hpc_files/lib/site.sh declares global tables (declare -A), so each check
# runs in a fresh bash that sources the libraries at top level, as
# job_submitter.sh does.

# site_setup: what every site test starts with: no site knobs from the
# environment, a private HOME, and SITE_FILE, the test's profile, in a folder
# whose name has a space in it.
site_setup() {
  unset HPC_SITE HPC_SITES_DIR
  export HOME="$BATS_TEST_TMPDIR/home"
  export SITE_FILE="$BATS_TEST_TMPDIR/a site/test.conf"
  mkdir -p "${SITE_FILE%/*}" "$HOME"
}

# in_toolkit DIR CODE: run CODE (with set -euo pipefail) after sourcing
# common, options and site from DIR/hpc_files, the HPC_FILES_DIR.
in_toolkit() {
  # shellcheck disable=SC2016 # expanded by the bash it starts
  run --separate-stderr bash -c 'set -euo pipefail
    HPC_FILES_DIR=$1
    source "$HPC_FILES_DIR/lib/common.sh"
    source "$HPC_FILES_DIR/lib/options.sh"
    source "$HPC_FILES_DIR/lib/site.sh"
    eval "$2"' _ "$1/hpc_files" "$2"
}

# in_libs CODE: in_toolkit with this repository's hpc_files.
in_libs() {
  in_toolkit "$REPO_ROOT" "$1"
}

# site LINE...: write the test profile.
site() {
  printf '%s\n' "$@" >"$SITE_FILE"
}
