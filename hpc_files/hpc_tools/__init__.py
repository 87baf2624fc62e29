"""The login-node tools behind job_submitter.sh, status.sh, results.sh and wandb_sync.sh.

Standard library only (PyYAML for sweep files, Optuna for method bayes and early_terminate,
matplotlib for PNGs, wandb-osh for the syncer), so that the login node's python3 (3.9+)
runs it without torch. The bash commands run a module with hpc_files/ on PYTHONPATH::

    PYTHONPATH=hpc_files python3 -m hpc_tools.trials --configs experiment_configurations.txt --list
    PYTHONPATH=hpc_files python3 -m hpc_tools.results results --project NAME EXP

Commands: ``trials`` (experiments -> trials manifest), ``bayes`` (method bayes rounds),
``prune`` (early_terminate settings), ``results`` (status, results, failed) and
``wandb_sync``. The other modules are their parts.
"""
