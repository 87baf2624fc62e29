"""Login-node search tools beside the submitter (not needed by training jobs).

``hpc_search.test_tube``: test-tube's ``SlurmCluster`` + ``HyperOptArgumentParser`` API
(the old Lightning recipe) over ``hpc_files/lib/trials.py`` and ``hpc_files/job_submitter.sh``.
"""
