"""hpc_harness: training that survives SLURM's wall time (see trainer.py, dist.py)."""

# The oldest torch with every feature the harness uses (pyproject.toml says the same):
# torch.distributed.fsdp.fully_shard is public from 2.6; torch.amp.GradScaler and
# init_process_group(device_id=...) from 2.3; torch.serialization.safe_globals from 2.5.
# A missing feature is reported in one line where it is needed, never worked around.
MIN_TORCH = "2.6"
