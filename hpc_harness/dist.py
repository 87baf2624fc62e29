"""Who am I in the job? The one table from launcher variables to ranks, and process-group setup.

Three ways a training process is started, and what each one tells us:

    launcher  how it is started                         variables read
    --------  ----------------------------------------  --------------------------------------
    torchrun  torchrun --nproc-per-node=G train.py      RANK, LOCAL_RANK, WORLD_SIZE,
              (alone, or one per node under srun)       LOCAL_WORLD_SIZE, GROUP_RANK,
                                                        MASTER_ADDR, MASTER_PORT
    srun      srun --ntasks-per-node=G python train.py  SLURM_PROCID -> rank,
              (one process per task; SLURM_STEP_ID set  SLURM_LOCALID -> local rank,
              and more than one task)                   SLURM_STEP_NUM_TASKS or SLURM_NTASKS
                                                        -> world size, SLURM_NODEID -> node rank,
                                                        MASTER_ADDR <- first host of
                                                        SLURM_JOB_NODELIST, MASTER_PORT <-
                                                        20000 + SLURM_JOB_ID % 20000
    single    python train.py (laptop, or one task)     nothing: world size 1, no process group

Variables already in the environment always win (the batch script exports MASTER_ADDR and
MASTER_PORT itself). torchrun variables win over SLURM ones (``srun torchrun`` sets both). A
batch script that runs ``python train.py`` directly in an allocation of several tasks, not
under srun, is refused with a message, instead of waiting forever for peers that never come.

Backend: nccl when CUDA is available, else gloo. Device: ``cuda:<local rank>`` (mapped through
``--gpus``), or ``cuda:0`` when each task sees exactly one GPU (``--gpus-per-task=1``,
``--gpu-bind=single:1``), or cpu. The process group is created with a timeout
(env ``HPC_DIST_TIMEOUT``, seconds, default 600) so a lost peer ends the job instead of
hanging it until the wall time.

This module imports torch only inside functions, so the table and the parsers are cheap to use.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from hpc_harness import MIN_TORCH

DEFAULT_TIMEOUT_S = 600


class LaunchError(RuntimeError):
    """The environment does not describe a launch we can join (message says what to do)."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, read from the launcher's variables."""

    launcher: str  # "torchrun" | "srun" | "single"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# --------------------------------------------------------------------------- node lists


def _expand_range(body: str) -> list[str]:
    """Expand the inside of brackets, e.g. ``1-3,05`` -> [``1``, ``2``, ``3``, ``05``]."""
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range '{part}' in node list")
            out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        elif part:
            out.append(part)
    return out


def _split_top_level(nodelist: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, depth, cur = [], 0, ""
    for ch in nodelist:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list '{nodelist}'")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list '{nodelist}'")
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def parse_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list without calling SLURM.

    ``node[1-3,5]`` -> node1 node2 node3 node5; ``a1,b[01-02]`` -> a1 b01 b02;
    ``gpu[1-2]-ib[3-4]`` -> gpu1-ib3 gpu1-ib4 gpu2-ib3 gpu2-ib4.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        parts = re.split(r"(\[[^\]]*\])", item)
        expanded = [""]
        for p in parts:
            if p.startswith("["):
                choices = _expand_range(p[1:-1])
            else:
                choices = [p]
            expanded = [e + c for e in expanded for c in choices]
        hosts.extend(expanded)
    return hosts


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``scontrol show hostnames`` if present, else our parser."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = parse_nodelist(nodelist)
    if not hosts:
        raise LaunchError(f"empty node list '{nodelist}'")
    return hosts[0]


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """SLURM's compressed task counts: ``2(x3),1`` means nodes 0-2 run 2 tasks, node 3 runs 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"cannot parse tasks per node '{tasks_per_node}'")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_index] if node_index < len(counts) else counts[-1]


def port_from_job_id(job_id: str) -> int:
    """A port in 20000-39999 derived from the job id, so jobs sharing a node rarely collide."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 20000 + int(digits) % 20000


# --------------------------------------------------------------------------- the table


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name} must be a whole number, got '{value}'") from None


def detect_launch(env: Mapping[str, str] | None = None) -> RankInfo:
    """Read the launcher's variables (see the module table). Pure apart from ``scontrol``."""
    env = os.environ if env is None else env
    torchrun_keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    present = [k for k in torchrun_keys if k in env]
    if present:
        missing = [k for k in torchrun_keys if k not in env]
        if missing:
            raise LaunchError(
                f"{', '.join(present)} set but {', '.join(missing)} missing: start the job "
                "with torchrun (which sets all of them) or unset them"
            )
        rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        node = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // max(local_world, 1)
        info = RankInfo(
            launcher="torchrun",
            rank=rank,
            local_rank=local,
            world_size=world,
            local_world_size=local_world,
            node_rank=node,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
        )
    else:
        ntasks_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        ntasks = _int(env, ntasks_key) if ntasks_key in env else 1
        if ntasks > 1 and "SLURM_STEP_ID" not in env:
            raise LaunchError(
                f"this SLURM allocation has {ntasks} tasks but the program was not started by "
                "srun or torchrun; launch it with 'srun python ...' (one process per task) or "
                "'srun --ntasks-per-node=1 torchrun --nproc-per-node=G ...'"
            )
        if ntasks <= 1:
            return RankInfo(launcher="single")
        for key in ("SLURM_PROCID", "SLURM_LOCALID"):
            if key not in env:
                raise LaunchError(f"srun launch with {ntasks} tasks but {key} is not set")
        rank, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID")
        node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
        tpn = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        local_world = tasks_on_node(tpn, node) if tpn else ntasks
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        else:
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if not nodelist:
                raise LaunchError("srun launch but neither MASTER_ADDR nor SLURM_JOB_NODELIST set")
            addr = first_host(nodelist)
        if "MASTER_PORT" in env:
            port = _int(env, "MASTER_PORT")
        else:
            port = port_from_job_id(env.get("SLURM_JOB_ID", "0"))
        info = RankInfo(
            launcher="srun",
            rank=rank,
            local_rank=local,
            world_size=ntasks,
            local_world_size=local_world,
            node_rank=node,
            master_addr=addr,
            master_port=port,
        )
    if not 0 <= info.rank < info.world_size:
        raise LaunchError(f"rank {info.rank} is outside world size {info.world_size}")
    if not 0 <= info.local_rank < max(info.local_world_size, 1):
        raise LaunchError(
            f"local rank {info.local_rank} is outside local world size {info.local_world_size}"
        )
    return info


# --------------------------------------------------------------------------- GPUs


def parse_gpus(spec: str | int | None) -> int | list[int] | None:
    """Lightning-style ``--gpus``: ``2`` -> two GPUs, ``0,1`` or ``"0, 1"`` -> those ids,
    ``-1`` -> all, ``0`` or empty -> none, ``None`` -> not given."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return spec
    text = spec.strip()
    if text == "":
        return 0
    if "," in text:
        ids = [p.strip() for p in text.split(",") if p.strip()]
        if not ids or not all(re.fullmatch(r"\d+", p) for p in ids):
            raise ValueError(f"--gpus expects a count (2), -1, or ids (0,1), got '{spec}'")
        return [int(p) for p in ids]
    if not re.fullmatch(r"-?\d+", text) or int(text) < -1:
        raise ValueError(f"--gpus expects a count (2), -1, or ids (0,1), got '{spec}'")
    return int(text)


def slurm_set_gpus(env: Mapping[str, str] | None = None) -> bool:
    """True when SLURM chose our GPUs (then ``--gpus`` is ignored: CUDA_VISIBLE_DEVICES rules)."""
    env = os.environ if env is None else env
    return "SLURM_JOB_ID" in env and "CUDA_VISIBLE_DEVICES" in env


def select_devices(spec: int | list[int] | None, available: int) -> list[int]:
    """Which CUDA device indices to use, given the parsed ``--gpus`` and how many are visible."""
    if available <= 0:
        return []
    if spec is None or spec == -1:
        return list(range(available))
    if isinstance(spec, list):
        bad = [i for i in spec if i >= available]
        if bad:
            raise ValueError(f"--gpus asks for device(s) {bad} but only {available} visible")
        return spec
    if spec > available:
        raise ValueError(f"--gpus {spec} but only {available} GPU(s) visible")
    return list(range(spec))


# --------------------------------------------------------------------------- process group


@dataclass
class DistContext:
    """What the trainer needs after setup: ranks, backend and the device this rank uses."""

    info: RankInfo
    backend: str
    device: Any  # torch.device
    devices: list[int]  # CUDA ids this process may use (DataParallel / ddp2), [] on CPU

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def rank(self) -> int:
        return self.info.rank


def setup(
    gpus: str | int | None = None, env: Mapping[str, str] | None = None, verbose: bool = True
) -> DistContext:
    """Detect the launch, pick backend and device, and join the process group if distributed.

    Every rank prints one ``hpc_harness: rank R/W local_rank L host H started`` line; rank 0
    also prints the summary line with world size, backend, device and launcher.
    """
    import datetime

    import torch
    import torch.distributed as dist

    info = detect_launch(env)
    cuda_n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    spec = parse_gpus(gpus)
    if slurm_set_gpus(env) and spec is not None and verbose and info.is_main:
        print("hpc_harness: --gpus ignored: SLURM set CUDA_VISIBLE_DEVICES", flush=True)
        spec = None
    if cuda_n == 0 and spec not in (None, 0) and verbose and info.is_main:
        print(
            f"hpc_harness: warning: --gpus {gpus} but CUDA is not available; using CPU", flush=True
        )
    devices = select_devices(None if slurm_set_gpus(env) else spec, cuda_n)
    if devices:
        backend = "nccl"
        if info.local_world_size > 1 and cuda_n == 1:
            # per-task binding (--gpus-per-task=1, --gpu-bind=single:1): this task sees
            # only its own GPU, as device 0, whatever its local rank
            devices = [0]
        elif info.local_world_size > 1:  # one GPU per process; else it uses them all
            if info.local_rank >= len(devices):
                raise LaunchError(
                    f"local rank {info.local_rank} has no GPU: {len(devices)} selected "
                    f"({devices}); ask for one GPU per task"
                )
            devices = [devices[info.local_rank]]
        device = torch.device("cuda", devices[0])
        torch.cuda.set_device(device)
    else:
        backend = "gloo"
        device = torch.device("cpu")

    if info.distributed:
        if (
            backend == "nccl"
            and "device_id" not in inspect.signature(dist.init_process_group).parameters
        ):
            raise LaunchError(
                f"hpc_harness needs init_process_group(device_id=...) (torch >= {MIN_TORCH}); "
                f"this torch is {torch.__version__}: upgrade torch"
            )
        e = os.environ
        e.setdefault("MASTER_ADDR", info.master_addr)
        e.setdefault("MASTER_PORT", str(info.master_port))
        e.setdefault("RANK", str(info.rank))
        e.setdefault("WORLD_SIZE", str(info.world_size))
        e.setdefault("LOCAL_RANK", str(info.local_rank))
        timeout = int(os.environ.get("HPC_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {}
            if backend == "nccl":
                kwargs["device_id"] = device
            dist.init_process_group(
                backend=backend,
                init_method="env://",
                rank=info.rank,
                world_size=info.world_size,
                timeout=datetime.timedelta(seconds=timeout),
                **kwargs,
            )
    if verbose:
        if info.is_main:
            say(
                f"hpc_harness: world_size={info.world_size} rank={info.rank} "
                f"local_rank={info.local_rank} node_rank={info.node_rank} backend={backend} "
                f"device={device} launcher={info.launcher}"
            )
        say(
            f"hpc_harness: rank {info.rank}/{info.world_size} local_rank {info.local_rank} "
            f"host {os.environ.get('SLURMD_NODENAME') or socket.gethostname()} started"
        )
    return DistContext(info=info, backend=backend, device=device, devices=devices)


def say(line: str, file: TextIO | None = None) -> None:
    """Print one line with one write(): with PYTHONUNBUFFERED, print() writes the text and the
    newline separately, and the lines of ranks sharing a pipe interleave mid-line."""
    out = file or sys.stdout
    out.write(line + "\n")
    out.flush()


def barrier() -> None:
    """Barrier when a process group exists, else nothing."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    """Leave the process group (if any)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
