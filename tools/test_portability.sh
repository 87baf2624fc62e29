#!/usr/bin/env bash
# The integration suite (tests/bats/integration) on what older and newer
# clusters run (`make test-portability`):
#   tools/test_portability.sh [bash42] [slurm24]     (default: both, in order)
#   bash42   with GNU bash 4.2 first on PATH (tools/with_bash42.sh), against
#            the cluster in SLURM_CONF (make cluster-up's); jobs inherit PATH,
#            so the node scripts run under 4.2 too.
#   slurm24  against a local SLURM 24.11 cluster started beside the default
#            one (local_cluster/cluster.sh with SLURM_PREFIX, default
#            /opt/slurm-24.11; unpacked from ../shared/tools/slurm-24.11 when
#            missing), with its bin/ first on PATH; the cluster is stopped
#            at the end if this script started it. The friendly shape
#            (HPC_CLUSTER_SHAPE), unless set: the shared 24.11 build has no
#            accounting_storage/mysql plugin for slurmdbd.
# Prints each part's wall time; exits 1 if any part failed.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly SLURM24_PREFIX="${SLURM_PREFIX:-/opt/slurm-24.11}"
readonly SLURM24_TARBALL="$REPO_ROOT/../shared/tools/slurm-24.11/slurm-24.11.7-debian12-x86_64.tar.xz"

die() {
  echo "test_portability.sh: error: $*" >&2
  exit 2
}

# timed NAME CMD...: run CMD, print how long it took and how it ended.
timed() {
  local name=$1 start rc=0
  shift
  start=$SECONDS
  "$@" || rc=$?
  echo "test_portability.sh: $name: $((SECONDS - start)) s, $( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)")"
  return "$rc"
}

run_bash42() {
  tools/with_bash42.sh bats -r tests/bats/integration
}

install_slurm24() {
  [[ -x "$SLURM24_PREFIX/sbin/slurmctld" ]] && return 0
  [[ "$SLURM24_PREFIX" == /opt/slurm-24.11 && -f "$SLURM24_TARBALL" ]] ||
    die "no SLURM in '$SLURM24_PREFIX' (build it: ../shared/tools/slurm-24.11/README.md)"
  echo "test_portability.sh: unpacking SLURM 24.11 into /opt"
  tar -xJf "$SLURM24_TARBALL" -C /opt
}

run_slurm24() {
  local cluster="$REPO_ROOT/local_cluster/cluster.sh" started=0 rc=0
  install_slurm24
  export HPC_CLUSTER_SHAPE="${HPC_CLUSTER_SHAPE:-friendly}"
  if ! SLURM_PREFIX="$SLURM24_PREFIX" "$cluster" status >/dev/null 2>&1; then
    SLURM_PREFIX="$SLURM24_PREFIX" "$cluster" up
    started=1
  fi
  (
    eval "$(SLURM_PREFIX="$SLURM24_PREFIX" "$cluster" env)"
    export SLURM_PREFIX="$SLURM24_PREFIX"
    echo "test_portability.sh: $(sbatch --version) (SLURM_CONF=$SLURM_CONF)"
    bats -r tests/bats/integration
  ) || rc=$?
  if ((started)); then
    SLURM_PREFIX="$SLURM24_PREFIX" "$cluster" down >/dev/null
  fi
  return "$rc"
}

main() {
  local part failed=0
  local -a parts=("$@")
  ((${#parts[@]} > 0)) || parts=(bash42 slurm24)
  cd "$REPO_ROOT"
  for part in "${parts[@]}"; do
    case "$part" in
      bash42) timed "integration suite, bash 4.2 first on PATH" run_bash42 || failed=1 ;;
      slurm24) timed "integration suite, SLURM 24.11" run_slurm24 || failed=1 ;;
      *) die "unknown part '$part' (expected bash42 or slurm24)" ;;
    esac
  done
  return "$failed"
}

main "$@"
