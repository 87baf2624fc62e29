#!/usr/bin/env bash
# The virtualenv setup job (job_submitter.sh --setup-venv REQUIREMENTS):
# creates or updates HPC_VENV from the requirements file on a compute node,
# before the training job, which depends on it (afterok). One setup at a time
# per venv (flock on HPC_VENV.lock); a digest stamp in the venv records which
# requirements it holds, so a second setup job for the same file does nothing.
#
# Environment: HPC_VENV, HPC_REQUIREMENTS (a copy in the submission folder),
# HPC_REQUIREMENTS_DIGEST, HPC_SETUP_PYTHON (default python3).
set -euo pipefail

# shellcheck source=lib.sh
source "${BASH_SOURCE[0]%/*}/lib.sh"

venv=${HPC_VENV:?}
requirements=${HPC_REQUIREMENTS:?}
digest=${HPC_REQUIREMENTS_DIGEST:?}
stamp=$(venv_stamp "$venv")

echo "hpc: setting up $venv from $requirements ($(date '+%F %T') on ${SLURMD_NODENAME:-$(hostname -s)})"
mkdir -p "$(dirname "$venv")"
exec {lock}>"$venv.lock"
flock -w 7200 "$lock" || {
  echo "hpc: error: another setup of $venv held its lock for 2 hours" >&2
  exit 1
}
if [[ -f "$stamp" && "$(<"$stamp")" == "$digest" ]]; then
  echo "hpc: $venv already matches these requirements; nothing to do"
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  "${HPC_SETUP_PYTHON:-python3}" -m venv "$venv"
fi
# The stamp goes first: a failed install must not leave an old stamp behind
# that a later job trusts.
rm -f -- "$stamp"
"$venv/bin/python" -m pip install --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -r "$requirements"
printf '%s\n' "$digest" >"$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
echo "hpc: $venv is ready ($(date '+%F %T'))"
