#!/usr/bin/env bash
# Installs what `make demo` and `make test` need, skipping what is already
# there: Debian packages (SLURM with slurmdbd and MariaDB for the local
# cluster's accounting, munge, bats, shellcheck) and the project
# virtualenv at .venv (torch==2.13.0 first, so pip never pulls a CUDA build).
#
# Usage: tools/install_deps.sh [system|venv|all|bench|mutation]   (default: all)
#   bench: what only the benchmarks use, on top of all (squashfs-tools,
#          squashfuse, fuse3); make bench runs all first (through cluster-up)
#   mutation: mutmut into .venv, on top of all (make mutation only; not a
#          make test dependency, not in pyproject.toml's digest)
# Non-interactive (CI=true, no stdin); root is needed only for apt-get.
set -euo pipefail

readonly PROG="install_deps.sh"
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly VENV="$REPO_ROOT/.venv"
readonly TORCH_PIN="torch==2.13.0"
# slurmdbd and mariadb-server: the local cluster runs its own instances
# (local_cluster/cluster.sh); the machine's own services are never started.
readonly APT_PACKAGES=(slurm-wlm slurmdbd mariadb-server munge bats bats-assert bats-support bats-file shellcheck iproute2 hyperfine)
# The staging benchmark compares extraction with a mounted squashfs image.
readonly BENCH_APT_PACKAGES=(squashfs-tools squashfuse fuse3)
# make mutation (tools/mutation.py); pinned: the report reads mutmut's result files.
readonly MUTMUT_PIN="mutmut==3.8.1"

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

# missing_apt_packages PACKAGE...: those not installed.
missing_apt_packages() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || echo "$pkg"
  done
}

# install_system PACKAGE...: apt-get install those missing.
install_system() {
  local missing
  missing=$(missing_apt_packages "$@" | tr '\n' ' ')
  if [[ -z "${missing// /}" ]]; then
    echo "$PROG: system packages present"
    return 0
  fi
  [[ "$(id -u)" == 0 ]] || die "missing Debian packages ($missing); run as root or: sudo apt-get install $missing"
  echo "$PROG: installing $missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  # shellcheck disable=SC2086 # package names, split on purpose
  apt-get install -y -qq --no-install-recommends $missing </dev/null >/dev/null ||
    die "apt-get install $missing failed"
}

# dependency_digest: a digest of what pip installs from pyproject.toml (the
# dependency lists and the torch pin), so editing tool settings there (pytest,
# ruff) does not rebuild the venv.
dependency_digest() {
  python3 - "$REPO_ROOT/pyproject.toml" "$TORCH_PIN" <<'PY' | sha256sum | cut -d' ' -f1
import json, sys
try:
    import tomllib
except ImportError:  # Python < 3.11: the whole file then
    print(sys.argv[2], open(sys.argv[1]).read())
    sys.exit(0)
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(json.dumps([sys.argv[2], project.get("dependencies"),
                  project.get("optional-dependencies")], sort_keys=True))
PY
}

# The venv is rebuilt only when its dependencies changed (digest stamp).
install_venv() {
  local stamp="$VENV/.hpc-stamp" digest
  digest=$(dependency_digest)
  if [[ -f "$stamp" && "$(<"$stamp")" == "$digest" ]] && "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    echo "$PROG: .venv up to date"
    return 0
  fi
  echo "$PROG: building .venv (torch first: $TORCH_PIN)"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  # pip compiles the bytecode on one core (about 30 s of CPU here);
  # compileall does it on all of them, once, after both installs.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "$TORCH_PIN" </dev/null ||
    die "pip install $TORCH_PIN failed"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile -e "${REPO_ROOT}[dev,wandb,lightning]" </dev/null ||
    die "pip install -e .[dev,wandb,lightning] failed"
  # A file that does not compile (a package's test data) stays source, as
  # pip leaves it.
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  echo "$digest" >"$stamp"
}

# install_mutmut: the pinned mutmut into .venv unless it is there.
install_mutmut() {
  local shown
  shown=$("$VENV/bin/python" -m pip show mutmut 2>/dev/null || true)
  if [[ $'\n'"$shown"$'\n' == *$'\n'"Version: ${MUTMUT_PIN#*==}"$'\n'* ]]; then
    echo "$PROG: $MUTMUT_PIN present"
    return 0
  fi
  echo "$PROG: installing $MUTMUT_PIN"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MUTMUT_PIN" </dev/null ||
    die "pip install $MUTMUT_PIN failed"
}

main() {
  case "${1:-all}" in
    system) install_system "${APT_PACKAGES[@]}" ;;
    venv) install_venv ;;
    all)
      install_system "${APT_PACKAGES[@]}"
      install_venv
      ;;
    bench) install_system "${BENCH_APT_PACKAGES[@]}" ;;
    mutation) install_mutmut ;;
    *)
      echo "$PROG: error: expected system, venv, all, bench or mutation; got '$1'" >&2
      exit 2
      ;;
  esac
}

main "$@"
