"""The ranks table (torchrun, srun, laptop, mismatches), node lists and --gpus parsing."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
from conftest import NodeStore

from hpc_harness import dist
from hpc_harness.dist import DistContext, LaunchError, detect_launch, first_host, parse_gpus


def test_laptop_is_single_process() -> None:
    info = detect_launch({})
    assert info == DistContext(launcher="single")
    assert not info.distributed and info.is_main


def test_torchrun_variables() -> None:
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        # srun torchrun: SLURM variables are present too, torchrun's win
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size) == ("torchrun", 5, 1, 8)
    assert (info.local_world_size, info.node_rank) == (4, 1)
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29400)


def test_srun_variables() -> None:
    env = {
        "SLURM_JOB_ID": "123457",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size) == ("srun", 3, 1, 4)
    assert (info.node_rank, info.local_world_size) == (1, 2)
    assert info.master_addr == "gpu07"
    assert info.master_port == 26588  # lib.sh's: 15000 + 123457 % 13985, 11 ports stepped over
    # A second step running beside it (sweeps packed into one job) on its own node: its own
    # address and port. From the job's node list and id alone, its ranks joined step 0's
    # rendezvous (or waited for a rank 0 on a node outside the step).
    step1 = {**env, "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "gpu[08-09]"}
    info = detect_launch(step1)
    assert (info.master_addr, info.master_port) == ("gpu08", 27591)  # job 124457's
    # the batch script's exports win
    info = detect_launch({**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456"})
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 23456)


def test_srun_with_one_task_is_single() -> None:
    env = {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
    assert detect_launch(env).launcher == "single"


def test_batch_script_without_srun_is_refused() -> None:
    with pytest.raises(LaunchError, match="srun or torchrun"):
        detect_launch({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"})


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "0"}, "WORLD_SIZE, LOCAL_RANK missing"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "outside world size"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK must be a whole number"),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
            "local rank 3",
        ),
        ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, "SLURM_PROCID"),
    ],
)
def test_mismatched_variables_are_errors(env: dict, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        detect_launch(env)


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("node1", "node1"),
        ("node[1-3,5]", "node1"),
        ("a1,b[01-02]", "a1"),
        ("b[01-02],a1", "b01"),
        ("gpu[1-2]-ib[3-4]", "gpu1-ib3"),
        ("cn[008-010],login", "cn008"),
    ],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["node[1-3", "node]1", "", "[x]"])
def test_first_host_rejects_garbage(nodelist: str) -> None:
    with pytest.raises(LaunchError, match="node list"):
        first_host(nodelist)


def test_tasks_per_node() -> None:
    assert dist.tasks_on_node("2(x3),1", 0) == 2
    assert dist.tasks_on_node("2(x3),1", 3) == 1


@pytest.mark.parametrize(
    "spec, parsed",
    [("2", 2), (" 2 ", 2), ("-1", -1), ("0", 0), ("", 0), (None, None)],
)
def test_parse_gpus(spec, parsed) -> None:
    assert parse_gpus(spec) == parsed


@pytest.mark.parametrize("spec", ["two", "0;1", "-2", "0,1", "1,"])
def test_parse_gpus_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpus(spec)


def test_select_devices() -> None:
    assert dist.select_devices(2, 4) == [0, 1]
    assert dist.select_devices(-1, 3) == [0, 1, 2]
    assert dist.select_devices(None, 2) == [0, 1]
    assert dist.select_devices(0, 2) == []
    assert dist.select_devices(2, 0) == []  # no CUDA: CPU fallback
    with pytest.raises(ValueError, match="--gpus asks for 5 but only 4"):
        dist.select_devices(5, 4)


def test_setup_single_process_on_cpu(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    ctx = dist.setup(gpus="2", env={})
    out = capsys.readouterr().out
    assert ctx.backend == "gloo" and str(ctx.device) == "cpu" and ctx.world_size == 1
    assert "CUDA is not available; using CPU" in out
    assert "hpc_harness: world_size=1 rank=0 local_rank=0 node_rank=0 backend=gloo" in out
    assert "hpc_harness: rank 0/1 local_rank 0 host " in out


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> dict:
    """Make torch report ``count`` CUDA devices and record what setup does with them.

    This fakes what torch reports: there is no GPU on the machine the tests run on."""
    import torch
    import torch.distributed as tdist

    seen: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.setdefault("device", d))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"GPU-fake-{i}")
    )
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)

    def init_process_group(*, device_id=None, **kw) -> None:
        seen["init"] = {**kw, "device_id": device_id}

    monkeypatch.setattr(tdist, "init_process_group", init_process_group)
    monkeypatch.setattr(tdist, "TCPStore", lambda *args: NodeStore({}))
    return seen


def _torchrun_env(local_rank: int, local_world: int) -> dict[str, str]:
    return {
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(local_world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
    }


def test_one_gpu_per_task_uses_device_0_on_every_local_rank(monkeypatch) -> None:
    # --gpus-per-task=1 / --gpu-bind=single:1: each of the 4 srun tasks on a node sees one
    # GPU of the node's 4 (SLURM_GPUS_ON_NODE).
    seen = _fake_gpus(monkeypatch, count=1)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}
    env.update(SLURM_STEP_NODELIST="node1", CUDA_VISIBLE_DEVICES="3", SLURM_GPUS_ON_NODE="4")
    ctx = dist.setup(env=env, verbose=False)
    assert ctx.backend == "nccl" and ctx.devices == [0]
    assert str(ctx.device) == "cuda:0" and str(seen["device"]) == "cuda:0"
    assert str(seen["init"]["device_id"]) == "cuda:0"


def test_node_wide_gpus_still_map_local_rank_to_its_gpu(monkeypatch) -> None:
    _fake_gpus(monkeypatch, count=4)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    ctx = dist.setup(env=_torchrun_env(local_rank=2, local_world=4), verbose=False)
    assert ctx.devices == [2] and str(ctx.device) == "cuda:2"


def test_more_local_ranks_than_gpus_is_refused(monkeypatch) -> None:
    _fake_gpus(monkeypatch, count=2)
    with pytest.raises(LaunchError, match="local rank 3 has no GPU"):
        dist.setup(env=_torchrun_env(local_rank=3, local_world=4), verbose=False)


def test_a_torch_whose_init_process_group_lacks_device_id_is_one_clear_error(monkeypatch) -> None:
    import torch.distributed as tdist

    _fake_gpus(monkeypatch, count=2)

    def old_init_process_group(
        backend=None, init_method=None, timeout=None, world_size=-1, rank=-1
    ):  # as on torch < 2.3: no device_id
        raise AssertionError("must not be called")

    monkeypatch.setattr(tdist, "init_process_group", old_init_process_group)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(LaunchError, match=r"needs init_process_group\(device_id=\.\.\.\)"):
        dist.setup(env=_torchrun_env(local_rank=1, local_world=2), verbose=False)


def test_gpus_is_ignored_when_slurm_chose_the_gpus(monkeypatch, capsys) -> None:
    _fake_gpus(monkeypatch, count=4)
    ctx = dist.setup(gpus="1", env={"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert ctx.devices == [0, 1, 2, 3]
    assert "--gpus ignored: SLURM set CUDA_VISIBLE_DEVICES" in capsys.readouterr().out
    assert dist.setup(gpus="1", env={"CUDA_VISIBLE_DEVICES": "0,1"}, verbose=False).devices == [0]


@pytest.mark.parametrize("rank", range(4))
def test_every_rank_of_torchrun_on_two_nodes_of_two(rank: int) -> None:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4"}
    info = detect_launch({**env, "LOCAL_WORLD_SIZE": "2"})
    assert (info.rank, info.local_rank, info.local_world_size, info.node_rank) == (
        rank,
        rank % 2,
        2,
        rank // 2,  # no GROUP_RANK: from the rank
    )
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)  # torchrun's defaults
    assert detect_launch({**env, "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "7"}).node_rank == 7


def test_torchrun_with_one_process_per_node_counts_nodes_by_rank() -> None:
    env = {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    assert detect_launch(env).node_rank == 1
    with pytest.raises(LaunchError) as refused:
        detect_launch({**env, "LOCAL_RANK": "1"})
    assert str(refused.value) == "local rank 1 is outside local world size 1"


@pytest.mark.parametrize("key", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_any_one_torchrun_variable_means_torchrun(key: str) -> None:
    with pytest.raises(LaunchError) as refused:
        detect_launch({key: "0"})
    missing = ", ".join(k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k != key)
    assert str(refused.value) == (
        f"{missing} missing: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK; start the job with "
        "torchrun or unset the launcher variables"
    )


@pytest.mark.parametrize("rank", range(4))
def test_every_rank_of_srun_on_two_nodes_of_two(rank: int) -> None:
    env = {
        "SLURM_JOB_ID": "4321_7",  # an array task: its digits choose the port
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % 2),
        "SLURM_NODEID": str(rank // 2),
        "SLURM_TASKS_PER_NODE": "2(x2)",  # the job's, when the step's is not set
        "SLURM_NODELIST": "gpu[07-08]",  # likewise
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size) == (
        "srun",
        rank,
        rank % 2,
        4,
    )
    assert (info.node_rank, info.local_world_size) == (rank // 2, 2)
    assert (info.master_addr, info.master_port) == ("gpu07", 16263)  # 15000 + 43217 % 13985 + 1


def test_srun_defaults_node_0_one_node_and_port_15000_without_a_job_id() -> None:
    env = {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}
    info = detect_launch({**env, "SLURM_TASKS_PER_NODE": "2", "MASTER_ADDR": "10.1.1.1"})
    assert (info.node_rank, info.local_world_size, info.master_port) == (0, 2, 15000)
    info = detect_launch({**env, "SLURM_JOB_NODELIST": "n1"})  # no tasks per node: one node
    assert (info.local_world_size, info.master_addr) == (2, "n1")
    # the step's task count wins over the job's
    assert (
        detect_launch(
            {**env, "SLURM_STEP_NUM_TASKS": "3", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"}
        ).world_size
        == 3
    )
    with pytest.raises(LaunchError) as refused:
        detect_launch(env)
    assert str(refused.value) == "srun launch but neither MASTER_ADDR nor SLURM_JOB_NODELIST set"
    with pytest.raises(LaunchError, match="node list"):  # an empty MASTER_ADDR is not a host
        detect_launch({**env, "MASTER_ADDR": ""})


def test_two_tasks_outside_srun_are_refused_with_the_way_to_launch() -> None:
    with pytest.raises(LaunchError) as refused:
        detect_launch({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    assert str(refused.value) == (
        "this SLURM allocation has 2 tasks but the program was not started by srun or "
        "torchrun; launch it with 'srun python ...' (one process per task) or "
        "'srun --ntasks-per-node=1 torchrun --nproc-per-node=G ...'"
    )


def test_a_variable_that_is_not_a_number_is_named_with_its_value() -> None:
    with pytest.raises(LaunchError) as refused:
        detect_launch({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "x1"})
    assert str(refused.value) == "MASTER_PORT must be a whole number, got 'x1'"


@pytest.mark.parametrize(
    ("initialized", "world_size", "is_group"),
    [(True, 2, True), (True, 3, True), (True, 1, False), (False, 2, False)],
)
def test_group_is_torch_distributed_only_with_more_than_one_rank(
    monkeypatch, initialized: bool, world_size: int, is_group: bool
) -> None:
    import torch.distributed as tdist

    monkeypatch.setattr(tdist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(tdist, "get_world_size", lambda group=None: world_size)
    assert dist.group() is (tdist if is_group else None)


LIB_SH = os.path.join(os.path.dirname(__file__), "..", "..", "hpc_files", "node", "lib.sh")


def _lib_sh(script: str, **env: str) -> str:
    """What ``script`` prints in bash after sourcing hpc_files/node/lib.sh (the batch script's)."""
    return subprocess.run(
        ["bash", "-c", f'source "$1" && {script}', "-", LIB_SH],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_the_ports_stepped_over_are_the_batch_scripts() -> None:
    listed = _lib_sh('echo "${MASTER_PORT_AVOID[*]}"').split()
    assert tuple(map(int, listed)) == dist.MASTER_PORT_AVOID


@pytest.mark.parametrize("port", [15007, 28998, 28999, *dist.MASTER_PORT_AVOID])
def test_an_srun_launch_of_step_0_takes_the_batch_scripts_port(port: int) -> None:
    """Each job whose port is a service's: stepped over as the batch script steps over it
    (job 1992: 16992, 16993, ... -> 16996); steps after 0 move the job 1000 a step."""
    job = port - 15000
    env = {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    env.update(SLURM_JOB_NODELIST="n1", SLURM_JOB_ID=str(job))
    assert str(detect_launch(env).master_port) == _lib_sh("master_port", SLURM_JOB_ID=str(job))
    assert dist.srun_port(job - 1000, 1) == dist.srun_port(job, 0)
