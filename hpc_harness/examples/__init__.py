"""Example programs (run with ``python -m hpc_harness.examples.NAME``)."""
