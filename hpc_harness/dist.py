"""Who am I in the job? The one table from launcher variables to ranks, and process-group setup.

:func:`detect_launch` holds the table: torchrun's variables, srun's (``SLURM_PROCID`` and the
rest), or none (world size 1).

Backend: nccl when CUDA is available, else gloo. Device: ``cuda:<local rank>`` (mapped through
``--gpus``), or when SLURM bound GPUs to tasks (``--gpus-per-task``, ``--gpu-bind``) one of
the task's own, not taken by a task bound to the same GPUs (:func:`own_devices`), or cpu. The
process group is created with a timeout (env ``HPC_DIST_TIMEOUT``, seconds, default 600) so a lost
peer ends the job instead of hanging it until the wall time.

This module imports torch only inside functions, so the table and the parsers are cheap to use.
"""

from __future__ import annotations

import datetime
import inspect
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hpc_harness import MIN_TORCH

DEFAULT_TIMEOUT_S = 600
# cleanup() releases the GIL this long before destroying the group: gloo's worker threads
# outlive destroy_process_group and free the work of the last DDP all-reduce only once they
# hold the GIL; if the interpreter is already finalizing by then, the process aborts
# ("terminate called without an active exception", SIGABRT) after a finished run.
GIL_YIELD_S = 0.1
# lib.sh's MASTER_PORT_AVOID, ascending, in its order (tests/python/test_dist.py compares them)
MASTER_PORT_AVOID = (
    *(15672, 16992, 16993, 16994, 16995, 17001, 17002, 17500),
    *(24007, 24008, 25565, 27017, 27018, 27019, 28015),
)


class LaunchError(RuntimeError):
    """The environment does not describe a launch we can join (message says what to do)."""


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job, read from the launcher's variables
    (:func:`detect_launch`); :func:`setup` adds the backend and the device this rank uses."""

    launcher: str  # "torchrun" | "srun" | "single"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "gloo"
    device: Any = None  # torch.device, set by setup()
    devices: list[int] = field(default_factory=list)  # CUDA ids it may use (DataParallel, ddp2)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list, without calling SLURM: ``node[3-5,9]`` -> node3,
    ``a1,b[01-02]`` -> a1, ``gpu[1-2]-ib[3-4]`` -> gpu1-ib3."""
    item = re.match(r"(?:[^,\[\]]|\[[^\[\]]*\])*", nodelist.strip()).group(0)  # type: ignore[union-attr]
    host = re.sub(r"\[(\d+)[^\]]*\]", r"\1", item)
    if not host or nodelist.count("[") != nodelist.count("]") or re.search(r"[\[\]]", host):
        raise LaunchError(f"cannot read the first host of node list '{nodelist}'")
    return host


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """SLURM's compressed task counts: ``2(x3),1`` means nodes 0-2 run 2 tasks, node 3 runs 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LaunchError(f"cannot parse tasks per node '{tasks_per_node}'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[min(node_index, len(counts) - 1)]


def detect_launch(env: Mapping[str, str] | None = None) -> DistContext:
    """Read the launcher's variables. Pure.

    Three ways a training process is started, and what each one tells us:

        launcher  how it is started                     variables read
        --------  ------------------------------------  --------------------------------------
        torchrun  torchrun --nproc-per-node=G train.py  RANK, LOCAL_RANK, WORLD_SIZE,
                  (alone, or one per node under srun)   LOCAL_WORLD_SIZE, GROUP_RANK,
                                                        MASTER_ADDR, MASTER_PORT
        srun      srun --ntasks-per-node=G python ...   SLURM_PROCID -> rank,
                  (a process per task; SLURM_STEP_ID  SLURM_LOCALID -> local rank,
                  set, more than one task)              SLURM_STEP_NUM_TASKS or SLURM_NTASKS
                                                        -> world size, SLURM_NODEID -> node rank,
                                                        MASTER_ADDR <- first host of
                                                        SLURM_STEP_NODELIST (else the job's),
                                                        MASTER_PORT <- 15000 + (SLURM_JOB_ID
                                                        + 1000 * SLURM_STEP_ID) % 14000,
                                                        services' ports stepped over
        single    python train.py (one process)         nothing: world size 1, no process group

    Variables already in the environment always win (the batch script exports MASTER_ADDR and
    MASTER_PORT itself). torchrun variables win over SLURM ones (``srun torchrun`` sets both). A
    batch script that runs ``python train.py`` directly in an allocation of several tasks, not
    under srun, is refused with a message, instead of waiting forever for peers that never come.
    """
    env = os.environ if env is None else env

    def num(name: str, default: int | None = None) -> int:
        if name not in env and default is not None:
            return default
        try:
            return int(env.get(name, ""))
        except ValueError:
            raise LaunchError(f"{name} must be a whole number, got '{env.get(name, '')}'") from None

    torchrun = any(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if not torchrun:
        world = num("SLURM_STEP_NUM_TASKS", num("SLURM_NTASKS", 1))
        if world > 1 and "SLURM_STEP_ID" not in env:
            raise LaunchError(
                f"this SLURM allocation has {world} tasks but the program was not started by "
                "srun or torchrun; launch it with 'srun python ...' (one process per task) or "
                "'srun --ntasks-per-node=1 torchrun --nproc-per-node=G ...'"
            )
        if world <= 1:
            return DistContext(launcher="single")
    launcher = "torchrun" if torchrun else "srun"
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK") if torchrun else ("SLURM_PROCID", "SLURM_LOCALID")
    missing = [k for k in keys if k not in env]
    if missing:
        raise LaunchError(
            f"{', '.join(missing)} missing: {launcher} sets {', '.join(keys)}; start the job "
            f"with {launcher} or unset the launcher variables"
        )
    if torchrun:
        rank, local, world = num("RANK"), num("LOCAL_RANK"), num("WORLD_SIZE")
        local_world = num("LOCAL_WORLD_SIZE", world)
        node = num("GROUP_RANK", rank // max(local_world, 1))
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), num("MASTER_PORT", 29500)
    else:
        rank, local, node = num("SLURM_PROCID"), num("SLURM_LOCALID"), num("SLURM_NODEID", 0)
        tpn = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        local_world = tasks_on_node(tpn, node) if tpn else world
        # this step's nodes and a port of its own: steps of one job may run side by side
        nodes = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        nodelist = next((env[k] for k in nodes if env.get(k)), "")
        if "MASTER_ADDR" not in env and not nodelist:
            raise LaunchError("srun launch but neither MASTER_ADDR nor SLURM_JOB_NODELIST set")
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        job = int(re.sub(r"\D", "", env.get("SLURM_JOB_ID", "")) or 0)
        step = num("SLURM_STEP_ID")  # set: an srun launch of several tasks has a step
        port = num("MASTER_PORT", srun_port(job, step))
    if not 0 <= rank < world:
        raise LaunchError(f"rank {rank} is outside world size {world}")
    if not 0 <= local < max(local_world, 1):
        raise LaunchError(f"local rank {local} is outside local world size {local_world}")
    return DistContext(launcher, rank, local, world, local_world, node, addr, port)


def srun_port(job: int, step: int) -> int:
    """The port of an srun launch without MASTER_PORT: hpc_files/node/lib.sh's master_port
    (15000-28999, below the ephemeral ports; the job id counts the ports common services do
    not use, so neighbouring jobs differ), offset by the step so that steps side by side
    differ. Step 0 gives the batch script's very port: the rule is that script's, and a test
    holds the two to it."""
    port = 15000 + (job + 1000 * step) % (14000 - len(MASTER_PORT_AVOID))
    for avoid in MASTER_PORT_AVOID:  # ascending
        port += port >= avoid
    return port


def parse_gpus(spec: str | int | None) -> int | None:
    """Lightning-style ``--gpus``: ``2`` -> two GPUs, ``-1`` -> all, ``0`` or empty -> none,
    ``None`` -> not given."""
    if spec is None or isinstance(spec, int):
        return spec
    if spec.strip() and (not re.fullmatch(r"\s*-?\d+\s*", spec) or int(spec) < -1):
        raise ValueError(f"--gpus expects a count (2), -1 for all, or 0, got '{spec}'")
    return int(spec.strip() or 0)


def select_devices(spec: int | None, available: int) -> list[int]:
    """Which CUDA device indices to use, given the parsed ``--gpus`` and how many are visible."""
    count = available if spec is None or spec == -1 else spec
    if count > available > 0:
        raise ValueError(f"--gpus asks for {spec} but only {available} GPU(s) visible")
    return list(range(min(count, available)))


def gpus_bound(info: DistContext, visible: int, on_node: str) -> bool:
    """SLURM bound GPUs to this srun task (``--gpus-per-task``, ``--gpu-bind``): it sees fewer
    than the step has on the node (``SLURM_GPUS_ON_NODE``)."""
    return info.launcher == "srun" and on_node.isdigit() and visible < int(on_node)


def own_devices(info: DistContext, devices: list[int], sharers: list[int] | None) -> list[int]:
    """The GPU of one of several processes on a node. GPUs bound by SLURM (:func:`gpus_bound`):
    of the local ranks that see this task's set (``sharers``, from :func:`local_ranks_seeing`;
    ``--gpu-bind=closest`` gives the tasks of one socket the same set), the n-th takes the
    set's n-th GPU. Else (``sharers`` None) the node's processes see the same GPUs (torchrun's
    workers always do): the one of its local rank. A process left without a GPU is refused
    (NCCL refuses two ranks on one GPU, later and less clearly)."""
    place, owners = info.local_rank, f"the {info.local_world_size} processes of this node"
    if sharers is not None:
        place, owners = sharers.index(info.local_rank), f"local ranks {sharers}, bound to them"
    if place >= len(devices):
        raise LaunchError(
            f"local rank {info.local_rank} has no GPU: {len(devices)} selected ({devices}) "
            f"for {owners}; start one process per GPU"
        )
    return [devices[place]]


def gpu_identities(count: int) -> str:
    """The GPUs this process sees, by identity (UUID), in CUDA's order: where SLURM fences
    each task's devices (cgroup ConstrainDevices) it numbers them from 0 in every task's
    CUDA_VISIBLE_DEVICES, so tasks bound to different GPUs all read "0" there."""
    import torch

    return ",".join(str(torch.cuda.get_device_properties(i).uuid) for i in range(count))


def local_ranks_seeing(info: DistContext, gpu_set: str, store: Any) -> list[int]:
    """The local ranks of this node whose tasks see ``gpu_set`` (:func:`gpu_identities`),
    learnt through the rendezvous ``store``: one key per task, read back once all are set;
    rank 0 returns once every rank has read."""
    key = f"hpc_harness/gpus/{info.node_rank}/"
    store.set(key + str(info.local_rank), gpu_set)
    sets = [store.get(key + str(i)).decode() for i in range(info.local_world_size)]
    # the store lives in rank 0's process: it goes on (refused, say) once every rank has read
    if store.add("hpc_harness/gpus/read", 1) == info.world_size:
        store.set("hpc_harness/gpus/all read", "")
    if info.is_main:
        store.wait(["hpc_harness/gpus/all read"])
    return [i for i, seen in enumerate(sets) if seen == gpu_set]


def setup(
    gpus: str | int | None = None, env: Mapping[str, str] | None = None, verbose: bool = True
) -> DistContext:
    """Detect the launch, pick backend and device, and join the process group if distributed.

    Every rank prints one ``hpc_harness: rank R/W local_rank L host H started`` line; rank 0
    also prints the summary line with world size, backend, device and launcher.
    """
    import torch
    import torch.distributed as dist

    info = detect_launch(env)
    say_main = say if verbose and info.is_main else lambda _: None
    cuda_n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    spec = parse_gpus(gpus)
    e = os.environ if env is None else env
    if "SLURM_JOB_ID" in e and "CUDA_VISIBLE_DEVICES" in e and spec is not None:
        say_main("hpc_harness: --gpus ignored: SLURM set CUDA_VISIBLE_DEVICES")
        spec = None
    if cuda_n == 0 and spec not in (None, 0):
        say_main(f"hpc_harness: warning: --gpus {gpus} but CUDA is not available; using CPU")
    devices = select_devices(spec, cuda_n)
    backend, device = "gloo", torch.device("cpu")
    joining = info.distributed and not dist.is_initialized()
    timeout = datetime.timedelta(seconds=int(os.environ.get("HPC_DIST_TIMEOUT", DEFAULT_TIMEOUT_S)))
    kwargs: dict[str, Any] = {}
    if devices and info.local_world_size > 1:  # one GPU per process; else it uses them all
        sharers = None
        if gpus_bound(info, cuda_n, e.get("SLURM_GPUS_ON_NODE", "")):
            sharers = [info.local_rank]  # in a group made before: as if no task shared its set
            if joining:  # the group's rendezvous store, made here so the tasks can meet first
                kwargs["store"] = dist.TCPStore(
                    info.master_addr, info.master_port, info.world_size, info.is_main, timeout
                )
                sharers = local_ranks_seeing(info, gpu_identities(cuda_n), kwargs["store"])
        devices = own_devices(info, devices, sharers)
    if devices:
        backend, device = "nccl", torch.device("cuda", devices[0])
        torch.cuda.set_device(device)
    if joining:
        if backend == "nccl":
            kwargs["device_id"] = device
        if (
            kwargs.get("device_id")
            and "device_id" not in inspect.signature(dist.init_process_group).parameters
        ):
            raise LaunchError(
                f"hpc_harness needs init_process_group(device_id=...) (torch >= {MIN_TORCH}); "
                f"this torch is {torch.__version__}: upgrade torch"
            )
        names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
        values = (info.master_addr, info.master_port, info.rank, info.world_size, info.local_rank)
        for k, v in zip(names, values):
            os.environ.setdefault(k, str(v))
        dist.init_process_group(
            backend=backend,  # init_method env:// (the variables set above), or the store
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
            **kwargs,
        )
    say_main(
        f"hpc_harness: world_size={info.world_size} rank={info.rank} "
        f"local_rank={info.local_rank} node_rank={info.node_rank} backend={backend} "
        f"device={device} launcher={info.launcher}"
    )
    if verbose:
        say(
            f"hpc_harness: rank {info.rank}/{info.world_size} local_rank {info.local_rank} "
            f"host {os.environ.get('SLURMD_NODENAME') or socket.gethostname()} started"
        )
    return replace(info, backend=backend, device=device, devices=devices)


def say(line: str) -> None:
    """Print one line with one write(): with PYTHONUNBUFFERED, print() writes the text and the
    newline separately, and the lines of ranks sharing a pipe interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def group() -> Any:
    """torch.distributed when a process group of more than one rank exists, else None: the one
    test for "collectives are needed" (pieces, StopAgreement, the Trainer's log and evaluate)."""
    import torch.distributed as dist

    ok = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return dist if ok else None


def barrier() -> None:
    """Barrier when a process group exists, else nothing."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    """Leave the process group (if any), first letting gloo's threads finish (GIL_YIELD_S)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        time.sleep(GIL_YIELD_S)
        dist.destroy_process_group()
