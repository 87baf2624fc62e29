"""Login-node search tools beside the submitter (not needed by training jobs).

``hpc_search.test_tube`` (code in ``slurm_cluster.py``): test-tube's ``SlurmCluster`` +
``HyperOptArgumentParser`` API (the old Lightning recipe) over ``hpc_tools.trials`` and
``hpc_files/job_submitter.sh``.
"""
