"""test-tube's import path, ``from hpc_search.test_tube import SlurmCluster``: slurm_cluster.py."""

# Kept because scripts written for test-tube import this name, on the login node and in every
# trial (where only the project is on PYTHONPATH, so the code stays in hpc_search).
from hpc_search.slurm_cluster import (
    HyperOptArgumentParser,
    HyperOptNamespace,
    SlurmCluster,
)

__all__ = ["HyperOptArgumentParser", "HyperOptNamespace", "SlurmCluster"]
