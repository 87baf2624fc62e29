#!/usr/bin/env bash
# `make demo`: the example training job, 2 nodes x 2 (fake) GPUs with torchrun,
# submitted through hpc_files/job_submitter.sh to the local cluster, with the
# digits dataset staged as a tarball into every node's local folder.
# Assumes the cluster is up (make cluster-up) and .venv exists (make deps).
#
# Knobs: HPC_DEMO_SCRATCH (default <repo>/.scratch), HPC_DEMO_PARTITION
# (tmpdir: the site provides SLURM_TMPDIR; notmpdir: the toolkit mimics it).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
export SCRATCH="${HPC_DEMO_SCRATCH:-$REPO_ROOT/.scratch}"
export SLURM_CONF="${SLURM_CONF:-$REPO_ROOT/.cluster/etc/slurm.conf}"
readonly PARTITION="${HPC_DEMO_PARTITION:-notmpdir}"
project_name=${REPO_ROOT##*/}
data_dir="$SCRATCH/$project_name/datasets/digits"

mkdir -p "$SCRATCH/$project_name/datasets"
if [[ ! -d "$data_dir" ]]; then
  echo "demo: writing the digits dataset (scikit-learn) to $data_dir"
  "$REPO_ROOT/.venv/bin/python" -c 'import sys; from hpc_harness.data import write_digits; write_digits(sys.argv[1])' "$data_dir"
fi
echo "demo: $(find "$data_dir" -type f | wc -l) files in $data_dir"

status=0
"$REPO_ROOT/hpc_files/job_submitter.sh" --site local --partition "$PARTITION" \
  --num-nodes 2 --gpus 2 --cpus 1 --which-distributed torchrun --time 00:10:00 \
  --exp-name demo --data datasets/digits --wait \
  -- python -m hpc_harness.train --epochs 8 --checkpoint-every 50 || status=$?

checkpoint="$SCRATCH/$project_name/demo/checkpoints/last.pt"
echo
if ((status == 0)); then
  echo "demo: the job finished. Checkpoint: $checkpoint"
  echo "demo: logs: $SCRATCH/$project_name/hpc_outputs/ ; submission folders: $SCRATCH/$project_name/demo/"
else
  echo "demo: the job ended with exit code $status; see the log above" >&2
fi
exit "$status"
