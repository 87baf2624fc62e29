"""dist.setup() in this process: what it prints on which rank, which backend and device it picks,
what it exports to the environment and what it passes to init_process_group.

There is no GPU and no peer here: torch.cuda (is_available, device_count, set_device) and
torch.distributed (is_initialized, init_process_group) are faked with monkeypatch, so these tests
pin what setup asks torch and what it hands it, as a GPU node of a real job would see it.
"""

from __future__ import annotations

import datetime
import inspect
import os
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as tdist
from conftest import NodeStore

from hpc_harness import dist
from hpc_harness.dist import LaunchError, detect_launch

# what setup exports for init_method env:// (and the other variables it reads)
EXPORTED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Remove ``names`` from os.environ now and again after the test, whatever setup sets."""
    for name in names:
        monkeypatch.setenv(name, "")  # recorded: undone (removed, or the old value) at teardown
        monkeypatch.delenv(name)


def _fake_torch(
    monkeypatch: pytest.MonkeyPatch,
    gpus: int = 0,
    cuda: bool | None = None,
    initialized: bool = False,
    node_sets: dict[int, str] | None = None,
) -> dict[str, list]:
    """torch reports ``gpus`` CUDA devices (available when there are any, unless ``cuda`` says
    otherwise) and no process group yet; returns what setup passed to set_device,
    init_process_group (the keyword arguments exactly as given) and TCPStore (a
    :class:`conftest.NodeStore` of ``node_sets`` stands for it)."""
    seen: dict[str, list] = {"set_device": [], "init": [], "store": []}

    def tcp_store(*args: Any) -> NodeStore:
        seen["store"].append(args)
        return NodeStore(node_sets or {})

    monkeypatch.setattr(tdist, "TCPStore", tcp_store)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0 if cuda is None else cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", seen["set_device"].append)
    # A GPU's identity: the node's GPU the task's CUDA_VISIBLE_DEVICES names (_srun's).
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=_VISIBLE[i])
    )
    monkeypatch.setattr(tdist, "is_initialized", lambda: initialized)

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        assert not args, "setup passes init_process_group keywords only"
        seen["init"].append(kwargs)

    # the real signature: setup checks it for device_id (torch >= 2.3)
    init_process_group.__signature__ = inspect.signature(tdist.init_process_group)  # type: ignore[attr-defined]
    monkeypatch.setattr(tdist, "init_process_group", init_process_group)
    _unset(monkeypatch, *EXPORTED, "HPC_DIST_TIMEOUT", "SLURMD_NODENAME")
    monkeypatch.setattr(dist.socket, "gethostname", lambda: "laptop")
    return seen


def _torchrun(rank: int, world: int, local_world: int | None = None) -> dict[str, str]:
    """torchrun's variables for ``rank`` of ``world`` on nodes of ``local_world`` processes."""
    local_world = world if local_world is None else local_world
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local_world),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
    }


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def _timeout(seconds: int) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def test_a_single_process_prints_its_summary_and_start_line_and_joins_no_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One process on a laptop: the summary line and the start line (host from the machine's
    name), gloo on the CPU, no process group and nothing exported to the environment."""
    seen = _fake_torch(monkeypatch)
    ctx = dist.setup(env={})
    assert _lines(capsys) == [
        "hpc_harness: world_size=1 rank=0 local_rank=0 node_rank=0 backend=gloo device=cpu "
        "launcher=single",
        "hpc_harness: rank 0/1 local_rank 0 host laptop started",
    ]
    assert (ctx.backend, str(ctx.device), ctx.devices) == ("gloo", "cpu", [])
    assert seen == {"set_device": [], "init": [], "store": []}
    assert [k for k in EXPORTED if k in os.environ] == []


def test_the_start_line_names_the_slurm_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under SLURM the start line names SLURMD_NODENAME, not the host name."""
    _fake_torch(monkeypatch)
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    dist.setup(env={})
    assert _lines(capsys)[-1] == "hpc_harness: rank 0/1 local_rank 0 host gpu07 started"


def test_rank_1_joins_a_gloo_group_with_the_launch_it_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 of 2 without CUDA: only its start line is printed (the summary and warnings are
    rank 0's); it exports the rendezvous variables for env:// and calls init_process_group
    with gloo, its rank, the world size and the default 600 s timeout, and no device_id."""
    seen = _fake_torch(monkeypatch)
    ctx = dist.setup(gpus="2", env=_torchrun(rank=1, world=2))
    assert _lines(capsys) == ["hpc_harness: rank 1/2 local_rank 1 host laptop started"]
    assert (ctx.backend, str(ctx.device), ctx.rank, ctx.world_size) == ("gloo", "cpu", 1, 2)
    assert seen["init"] == [
        {"backend": "gloo", "rank": 1, "world_size": 2, "timeout": _timeout(600)}
    ]
    assert {k: os.environ.get(k) for k in EXPORTED} == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
    }


def test_the_environment_already_set_wins_and_hpc_dist_timeout_sets_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An srun task: variables already exported (the batch script's MASTER_PORT) stay; the
    others come from the SLURM variables; HPC_DIST_TIMEOUT (seconds) is the group's timeout."""
    seen = _fake_torch(monkeypatch)
    monkeypatch.setenv("MASTER_PORT", "23456")
    monkeypatch.setenv("HPC_DIST_TIMEOUT", "77")
    env = {
        "SLURM_JOB_ID": "20007",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "cn[3-4]",
    }
    ctx = dist.setup(env=env, verbose=False)
    assert (ctx.launcher, ctx.rank, ctx.local_rank, ctx.node_rank) == ("srun", 2, 0, 1)
    assert {k: os.environ.get(k) for k in EXPORTED} == {
        "MASTER_ADDR": "cn3",
        "MASTER_PORT": "23456",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
    }
    assert seen["init"] == [
        {"backend": "gloo", "rank": 2, "world_size": 4, "timeout": _timeout(77)}
    ]


def test_a_process_group_that_exists_is_not_created_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the caller already initialised torch.distributed, setup neither exports the
    variables nor calls init_process_group; verbose=False prints nothing, on rank 0 too."""
    seen = _fake_torch(monkeypatch, initialized=True)
    ctx = dist.setup(env=_torchrun(rank=0, world=2), verbose=False)
    assert ctx.distributed and ctx.is_main
    assert seen["init"] == []
    assert [k for k in EXPORTED if k in os.environ] == []
    assert capsys.readouterr().out == ""


def test_each_local_rank_takes_its_gpu_and_names_it_as_the_nccl_device_id(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two processes on a node with two visible GPUs (faked): local rank 1 uses cuda:1 only,
    sets it as the current device and passes it to init_process_group as device_id (nccl)."""
    seen = _fake_torch(monkeypatch, gpus=2)
    ctx = dist.setup(env=_torchrun(rank=1, world=2))
    assert (ctx.backend, str(ctx.device), ctx.devices) == ("nccl", "cuda:1", [1])
    assert seen["set_device"] == [torch.device("cuda", 1)]
    assert seen["init"] == [
        {
            "backend": "nccl",
            "rank": 1,
            "world_size": 2,
            "timeout": _timeout(600),
            "device_id": torch.device("cuda", 1),
        }
    ]
    assert _lines(capsys) == ["hpc_harness: rank 1/2 local_rank 1 host laptop started"]


def test_rank_0_prints_the_nccl_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 of 2 with two GPUs (faked): the summary names nccl, cuda:0 and the launcher."""
    _fake_torch(monkeypatch, gpus=2)
    dist.setup(env=_torchrun(rank=0, world=2))
    assert _lines(capsys) == [
        "hpc_harness: world_size=2 rank=0 local_rank=0 node_rank=0 backend=nccl device=cuda:0 "
        "launcher=torchrun",
        "hpc_harness: rank 0/2 local_rank 0 host laptop started",
    ]


@pytest.mark.parametrize(
    "gpus, visible, local_rank, message",
    [
        (None, 2, 2, "local rank 2 has no GPU: 2 selected ([0, 1]) for the 4 processes"),
        ("1", 4, 1, "local rank 1 has no GPU: 1 selected ([0]) for the 4 processes"),
    ],
)
def test_a_local_rank_without_a_gpu_of_its_own_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    gpus: str | None,
    visible: int,
    local_rank: int,
    message: str,
) -> None:
    """Four processes on a node where fewer GPUs are selected than local ranks (faked): the
    first local rank past the last GPU gets one LaunchError saying what to ask for."""
    seen = _fake_torch(monkeypatch, gpus=visible)
    with pytest.raises(LaunchError) as refused:
        dist.setup(gpus=gpus, env=_torchrun(rank=local_rank, world=4), verbose=False)
    assert str(refused.value) == message + " of this node; start one process per GPU"
    assert seen["init"] == []


def test_gpus_that_cuda_cannot_use_mean_the_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node whose driver cannot run this torch's CUDA: NVML still counts the GPUs
    (device_count 2) but is_available() is False (faked). setup trusts is_available: gloo on
    the CPU, no set_device, and the warning that --gpus cannot be honoured."""
    seen = _fake_torch(monkeypatch, gpus=2, cuda=False)
    ctx = dist.setup(gpus="1", env={})
    assert (ctx.backend, str(ctx.device), ctx.devices) == ("gloo", "cpu", [])
    assert seen["set_device"] == []
    assert _lines(capsys)[0] == (
        "hpc_harness: warning: --gpus 1 but CUDA is not available; using CPU"
    )


@pytest.mark.parametrize(
    "visible, gpus, warning",
    [
        (0, "1", "hpc_harness: warning: --gpus 1 but CUDA is not available; using CPU"),
        (0, "-1", "hpc_harness: warning: --gpus -1 but CUDA is not available; using CPU"),
        (0, "0", None),  # asked for none: nothing to warn about
        (0, None, None),
        (4, "2", None),  # CUDA is there: no CPU warning
    ],
)
def test_rank_0_warns_when_gpus_were_asked_for_without_cuda(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    visible: int,
    gpus: str | None,
    warning: str | None,
) -> None:
    """The CPU warning is printed (by rank 0, before the summary) exactly when --gpus asks for
    GPUs and torch reports no CUDA (faked)."""
    _fake_torch(monkeypatch, gpus=visible)
    ctx = dist.setup(gpus=gpus, env={})
    lines = _lines(capsys)
    assert lines[:-2] == ([warning] if warning else [])
    assert lines[-2].startswith("hpc_harness: world_size=1 ")
    assert ctx.devices == ([0, 1] if visible else [])


def test_gpus_ignored_under_slurm_is_said_once_by_rank_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SLURM chose the GPUs (CUDA_VISIBLE_DEVICES in a job, 4 faked): --gpus 1 is ignored and
    rank 0 says so in one exact line before its summary; rank 1 prints no such line."""
    _fake_torch(monkeypatch, gpus=4)
    slurm = {"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    ctx = dist.setup(gpus="1", env=slurm)
    assert ctx.devices == [0, 1, 2, 3]
    lines = _lines(capsys)
    assert lines[0] == "hpc_harness: --gpus ignored: SLURM set CUDA_VISIBLE_DEVICES"
    assert len(lines) == 3
    dist.setup(gpus="1", env={**slurm, **_torchrun(rank=1, world=2)})
    assert _lines(capsys) == ["hpc_harness: rank 1/2 local_rank 1 host laptop started"]


def test_more_gpus_asked_for_than_the_one_visible_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--gpus 2 where one GPU is visible is refused (as with 4 of 2), not cut down to one."""
    with pytest.raises(ValueError) as refused:
        dist.select_devices(2, 1)
    assert str(refused.value) == "--gpus asks for 2 but only 1 GPU(s) visible"
    _fake_torch(monkeypatch, gpus=1)
    with pytest.raises(ValueError, match=r"^--gpus asks for 2 but only 1 GPU\(s\) visible$"):
        dist.setup(gpus="2", env={}, verbose=False)


@pytest.mark.parametrize("job_id, digits", [("12345+1", 123451), ("12345.batch", 12345)])
def test_the_srun_port_comes_from_the_digits_of_the_job_id(job_id: str, digits: int) -> None:
    """Characters of SLURM_JOB_ID that are not digits are dropped before choosing the port."""
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "n1",
    }
    assert detect_launch(env).master_port == dist.srun_port(digits, 0)


def test_cleanup_lets_gloo_threads_take_the_gil_before_it_destroys_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gloo's worker threads outlive destroy_process_group and release the last DDP all-reduce
    only once they hold the GIL; at interpreter exit that aborts a finished run (SIGABRT). So
    cleanup() sleeps (releasing the GIL) before destroying the group, and does neither when
    there is no group. (The abort itself is a race: measured side by side in a 2-rank DDP
    script, 5 of 20 exits aborted without the sleep, 0 of 40 with it.)"""
    events: list[Any] = []
    monkeypatch.setattr(dist.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setattr(tdist, "destroy_process_group", lambda: events.append("destroy"))
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    dist.cleanup()
    assert events == []
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    dist.cleanup()
    assert events == [("sleep", dist.GIL_YIELD_S), "destroy"]
    assert 0.05 <= dist.GIL_YIELD_S <= 0.5


# The GPUs the task _srun made last sees, by their node's numbers: the fake torch's UUIDs.
_VISIBLE: list[str] = []


def _srun(local_rank: int, local_world: int, visible: str, on_node: int) -> dict[str, str]:
    """An srun task's variables as SLURM 24.11 sets them on the local cluster (one node):
    ``visible`` is the task's CUDA_VISIBLE_DEVICES, ``on_node`` SLURM_GPUS_ON_NODE (the
    step's GPUs on the node). Bound (--gpus-per-task, --gpu-bind=single:1): a task sees
    fewer than the node's; unbound (--gres=gpu:N): every task sees them all."""
    _VISIBLE[:] = [v for v in visible.split(",") if v]
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(local_rank),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NTASKS": str(local_world),
        "SLURM_STEP_TASKS_PER_NODE": str(local_world),
        "SLURM_STEP_NODELIST": "node1",
        "CUDA_VISIBLE_DEVICES": visible,
        "SLURM_GPUS_ON_NODE": str(on_node),
    }


@pytest.mark.parametrize(
    "case, local_rank, local_world, visible, on_node, device",
    [
        ("--gpus-per-task=1", 1, 2, "1", 2, "cuda:0"),
        ("--gres=gpu:2 --gpu-bind=single:1", 1, 2, "1", 2, "cuda:0"),
        ("--gpus-per-task=2, 4 tasks", 2, 4, "4,5", 8, "cuda:0"),
        ("--gres=gpu:4, 4 tasks", 3, 4, "0,1,2,3", 4, "cuda:3"),
    ],
)
def test_an_srun_task_uses_a_gpu_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    local_rank: int,
    local_world: int,
    visible: str,
    on_node: int,
    device: str,
) -> None:
    """GPUs bound to the task (it sees fewer than the node's): its first; the node's GPUs
    seen by every task: the one of its local rank. torch's device count is faked from
    CUDA_VISIBLE_DEVICES (no GPU here); tests/bats/integration/harness.bats checks the same
    on the local cluster's fake GPUs."""
    seen = _fake_torch(monkeypatch, gpus=len(visible.split(",")))
    ctx = dist.setup(env=_srun(local_rank, local_world, visible, on_node), verbose=False)
    assert (str(ctx.device), seen["init"][0]["device_id"]) == (device, torch.device(device)), case
    assert ctx.devices == [torch.device(device).index]  # one GPU, not the task's others


def test_without_slurm_gpus_on_node_srun_tasks_use_their_local_ranks_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUs SLURM does not manage (no gres: SLURM_GPUS_ON_NODE unset): every task sees the
    node's, and takes its local rank's."""
    _fake_torch(monkeypatch, gpus=2)
    env = _srun(1, 2, "0,1", 2)
    del env["SLURM_GPUS_ON_NODE"]
    assert str(dist.setup(env=env, verbose=False).device) == "cuda:1"


@pytest.mark.parametrize(
    "env, message",
    [
        (  # torchrun's workers share the node's GPUs: two of them on one GPU
            _torchrun(rank=1, world=2),
            "local rank 1 has no GPU: 1 selected ([0]) for the 2 processes of this node; "
            "start one process per GPU",
        ),
        (  # srun --gres=gpu:1 --ntasks-per-node=2: both tasks see the one GPU
            _srun(1, 2, "0", 1),
            "local rank 1 has no GPU: 1 selected ([0]) for the 2 processes of this node; "
            "start one process per GPU",
        ),
    ],
)
def test_processes_that_would_share_a_gpu_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), at the first collective:
    this says why before the process group, in one line."""
    seen = _fake_torch(monkeypatch, gpus=1)
    with pytest.raises(LaunchError) as refused:
        dist.setup(env=env, verbose=False)
    assert str(refused.value) == message
    assert seen["init"] == []


# --gpu-bind=closest on a node of two sockets with two GPUs each, four tasks placed by SLURM's
# default distribution (block:cyclic: tasks alternate sockets): tasks 0 and 2 see GPUs 0,1,
# tasks 1 and 3 see GPUs 2,3 (what --gpu-bind=mask_gpu:0x3,0xc,0x3,0xc also gives).
CLOSEST_SETS = {0: "0,1", 1: "2,3", 2: "0,1", 3: "2,3"}


@pytest.mark.parametrize("local_rank, node_gpu", [(0, "0"), (1, "2"), (2, "1"), (3, "3")])
def test_tasks_bound_to_the_same_gpus_take_one_each(
    monkeypatch: pytest.MonkeyPatch, local_rank: int, node_gpu: str
) -> None:
    """The task's place among the local ranks that see its set picks the set's GPU, learnt
    through the rendezvous store that then makes the process group (faked: no peers here;
    tests/bats/integration/harness.bats runs it on the local cluster with a real store)."""
    seen = _fake_torch(monkeypatch, gpus=2, node_sets=CLOSEST_SETS)
    env = _srun(local_rank, 4, CLOSEST_SETS[local_rank], 4)
    ctx = dist.setup(env=env, verbose=False)
    assert CLOSEST_SETS[local_rank].split(",")[ctx.device.index] == node_gpu
    timeout = _timeout(dist.DEFAULT_TIMEOUT_S)
    assert seen["store"] == [("node1", 15007, 4, local_rank == 0, timeout)]
    assert seen["init"] == [
        {
            "backend": "nccl",
            "rank": local_rank,
            "world_size": 4,
            "timeout": timeout,
            "store": seen["init"][0]["store"],
            "device_id": ctx.device,
        }
    ]
    store = seen["init"][0]["store"]
    assert isinstance(store, NodeStore)  # rank 0's holds the store: it waits for every read
    assert store.waited == (["hpc_harness/gpus/all read"] if local_rank == 0 else [])


def test_more_tasks_bound_to_a_gpu_than_it_has_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """--gpu-bind=map_gpu:0,1,0,1 on a node of two GPUs: tasks 0 and 2 both see GPU 0."""
    seen = _fake_torch(monkeypatch, gpus=1, node_sets={0: "0", 1: "1", 3: "1"})
    with pytest.raises(LaunchError) as refused:
        dist.setup(env=_srun(2, 4, "0", 2), verbose=False)
    assert str(refused.value) == (
        "local rank 2 has no GPU: 1 selected ([0]) for local ranks [0, 2], bound to them; "
        "start one process per GPU"
    )
    assert seen["init"] == []


def test_the_local_ranks_seeing_a_set_are_read_from_this_nodes_keys() -> None:
    """A real store (in-process): node 1's tasks, not node 0's, whatever the order they wrote."""
    store = tdist.HashStore()
    store.set_timeout(_timeout(5))  # a key read that is never written fails in 5 s, not 300
    info = dist.DistContext(
        "srun", rank=6, local_rank=2, world_size=8, local_world_size=4, node_rank=1
    )
    for node, local, gpus in [(0, 0, "0,1"), (1, 3, "0,1"), (1, 1, "2,3"), (1, 0, "0,1")]:
        store.set(f"hpc_harness/gpus/{node}/{local}", gpus)
    assert dist.local_ranks_seeing(info, "0,1", store) == [0, 2, 3]
    assert store.get("hpc_harness/gpus/1/2") == b"0,1"
    assert store.add("hpc_harness/gpus/read", 0) == 1  # this rank has read; 7 to go


def test_rank_0_holding_the_store_returns_once_every_rank_has_read() -> None:
    """Rank 0's process holds the store: had it gone on (to a refusal, say) before rank 1 read,
    rank 1's read would fail ("Connection was likely closed": seen on the local cluster)."""
    store = tdist.HashStore()
    store.set_timeout(_timeout(30))
    ranks = [dist.DistContext("srun", r, r, 2, 2) for r in (0, 1)]
    store.set("hpc_harness/gpus/0/1", "0")  # rank 1 has written its set, not read yet
    done: list[list[int]] = []
    rank_0 = threading.Thread(
        target=lambda: done.append(dist.local_ranks_seeing(ranks[0], "0", store)), daemon=True
    )
    rank_0.start()
    rank_0.join(0.3)
    assert rank_0.is_alive() and done == []
    assert dist.local_ranks_seeing(ranks[1], "0", store) == [0, 1]
    rank_0.join(30)
    assert done == [[0, 1]]


def test_in_a_group_made_before_a_bound_task_takes_the_first_of_its_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No rendezvous store of ours to meet in: as before, the first of the task's own."""
    seen = _fake_torch(monkeypatch, gpus=1, initialized=True)
    assert str(dist.setup(env=_srun(1, 2, "1", 2), verbose=False).device) == "cuda:0"
    assert seen["store"] == [] and seen["init"] == []


def test_tasks_whose_variables_read_alike_but_whose_gpus_differ_take_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ConstrainDevices SLURM numbers each task's GPUs from 0: two tasks bound to
    different GPUs both read CUDA_VISIBLE_DEVICES=0. They tell them apart by UUID."""
    seen = _fake_torch(monkeypatch, gpus=1, node_sets={0: "GPU-a"})
    env = _srun(1, 2, "0", 2)
    _VISIBLE[:] = ["GPU-b"]
    assert str(dist.setup(env=env, verbose=False).device) == "cuda:0"
    assert seen["set_device"] == [torch.device("cuda", 0)]


def test_every_job_id_in_a_cycle_of_the_port_range_has_a_port_of_its_own() -> None:
    """A port stepped over must not land on the next job's (672 and 673: 15672 is stepped over)."""
    free = 14000 - len(dist.MASTER_PORT_AVOID)
    ports = {dist.srun_port(job, 0) for job in range(free)}
    assert len(ports) == free
    assert min(ports) == 15000 and max(ports) == 28999
    assert not ports & set(dist.MASTER_PORT_AVOID)
    assert dist.srun_port(free, 0) == 15000


def test_the_srun_port_steps_over_a_run_of_services_ports() -> None:
    """lib.sh's master_port gives these (tests/python/test_dist.py runs it; here in-process)."""
    assert [dist.srun_port(job, 0) for job in (7, 1992, 13015)] == [15007, 16997, 28030]
