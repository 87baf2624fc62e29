"""One whole submitit submission (bench/submit_latency.sh): import, submit, print the id.

    python bench/submitit_submit.py FOLDER [--begin now+3600]

Submits ``true`` (``submitit.helpers.CommandFunction(["true"])``) with ``SlurmExecutor`` to
the cluster named by ``$SLURM_CONF``, in partition ``tmpdir``, and prints the job id. The
import is part of what is timed: that is what a user's submit script pays.
"""

import sys

import submitit


def main() -> int:
    folder = sys.argv[1]
    begin = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--begin" else None
    executor = submitit.SlurmExecutor(folder=folder)
    params = {"time": 60, "partition": "tmpdir", "cpus_per_task": 1}
    if begin:
        params["additional_parameters"] = {"begin": begin}
    executor.update_parameters(**params)
    job = executor.submit(submitit.helpers.CommandFunction(["true"]))
    print(job.job_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
