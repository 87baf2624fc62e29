#!/usr/bin/env bash
# The checks that need a GPU, in one run, for a machine with one (CI has none):
#   1. bench/gpu_loop_overhead.py: the Trainer and a pieces loop against a raw loop on one
#      GPU, and the host synchronisations each makes per epoch (writes BENCHMARKS_GPU.md);
#   2. the harness's pytest files with CUDA visible: the subprocess runs (charlm, the example
#      job) train on the GPU, so their bitwise-resume checks cover CUDA's RNG and kernels.
# Usage: tools/gpu_check.sh [OUTDIR]   (default build/gpu_check; python3 with a CUDA build of
# torch, pytest, pytest-xdist and pytest-timeout; PYTHON overrides python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-build/gpu_check}
python=${PYTHON:-python3}

if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: error: $python's torch sees no CUDA device (PYTHON=... names a python whose torch has CUDA)" >&2
  exit 2
fi
mkdir -p "$out"
nvidia-smi -L || true
"$python" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'

rc=0
PYTHONPATH=bench:. timeout 330 "$python" bench/gpu_loop_overhead.py --out "$out/BENCHMARKS_GPU.md" \
  >"$out/bench.log" 2>&1 || rc=$?
grep -E '^(###|- )' "$out/bench.log" || true
echo "gpu_check: benchmark exit $rc (log: $out/bench.log)"

# The login-node tools (search, trials, W&B, results) need no GPU; the rest is the harness.
files=()
for f in tests/python/test_*.py; do
  [[ "$f" =~ bayes|trials|wandb|results|test_tube|mutation|slurm_lists ]] || files+=("$f")
done
test_rc=0
timeout 170 "$python" -m pytest -q -p no:cacheprovider -n "${GPU_CHECK_JOBS:-12}" --timeout 150 \
  -rfE "${files[@]}" >"$out/pytest.log" 2>&1 || test_rc=$?
tail -n 60 "$out/pytest.log"
echo "gpu_check: pytest exit $test_rc (log: $out/pytest.log)"
((rc == 0 && test_rc == 0))
