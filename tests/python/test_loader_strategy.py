"""The DataLoader rebuilt around the harness's sampler, and a Strategy's launch checks.

prepare_dataloader: which of the user's settings the rebuilt loader keeps (the worker-only
ones only with workers), its defaults (one process, rank 0, seed 0), drop_last handed to the
sampler, and the warning (flushed, rank 0 of a group only) when the user's sampler is kept.
Strategy: the exact messages of the layouts it refuses, when it counts as distributed and
needs the gradient all-reduce (``dist.is_initialized`` faked: no process group here), and
the load of a sharded checkpoint folder as rank 1 of a fake group of 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.state_dict  # noqa: F401  (its first import takes a second)
import torch.distributed.fsdp as fsdp
from conftest import HANG_GUARD_S, PY, clean_env, job_log
from test_strategy_state import _ctx, _same_optimizer_state, _trained, fake_group  # noqa: F401
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hpc_harness import MIN_TORCH
from hpc_harness import data as data_module
from hpc_harness import strategy as strategy_module
from hpc_harness.data import ResumableSampler, prepare_dataloader
from hpc_harness.strategy import Strategy, StrategyError, check_strategy

KEPT_SAMPLER = (
    "hpc_harness: warning: DataLoader keeps its own sampler; make sure it shards the data "
    "across ranks\n"
)


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n))


def _collate(batch: list) -> list:
    return batch


def _init_worker(worker_id: int) -> None:
    pass


def test_the_rebuilt_loader_keeps_the_users_settings_with_workers() -> None:
    """Every setting of the user's loader is kept, persistent_workers and prefetch_factor too
    when it has workers (one is enough); the sampler is the harness's and the loader's
    generator is seeded with the run's seed. (Building a loader starts no worker.)"""
    loader = DataLoader(
        _dataset(10),
        batch_size=3,
        shuffle=True,
        num_workers=1,
        collate_fn=_collate,
        pin_memory=True,
        drop_last=True,
        timeout=7,
        worker_init_fn=_init_worker,
        persistent_workers=True,
        prefetch_factor=5,
    )
    wrapped, sampler = prepare_dataloader(loader, world_size=2, rank=1, seed=11)
    assert isinstance(sampler, ResumableSampler) and wrapped.sampler is sampler
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (2, 1, True, 11)
    assert wrapped.generator.initial_seed() == 11
    kept = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout")
    kept += ("persistent_workers", "prefetch_factor")
    assert wrapped.worker_init_fn.args == (_init_worker,)  # run by the signal shield
    assert {k: getattr(wrapped, k) for k in kept} == {
        "batch_size": 3,
        "num_workers": 1,
        "collate_fn": _collate,
        "pin_memory": True,
        "drop_last": True,
        "timeout": 7,
        "persistent_workers": True,
        "prefetch_factor": 5,
    }


def test_the_rebuilt_loader_keeps_the_workers_start_method_pinning_device_and_order() -> None:
    """spawn workers (h5py, fork after threads), the pinning device and out-of-order batches
    were dropped: the rebuilt loader forked its workers."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    loader = DataLoader(
        _dataset(10),
        batch_size=2,
        shuffle=True,
        num_workers=1,
        multiprocessing_context=spawn,
        pin_memory=True,
        pin_memory_device="cpu",
        in_order=False,
    )
    wrapped, sampler = prepare_dataloader(loader, world_size=2, rank=0)
    assert isinstance(sampler, ResumableSampler)
    assert wrapped.multiprocessing_context is spawn
    assert (wrapped.pin_memory_device, wrapped.in_order) == ("cpu", False)


def test_a_random_sampler_that_draws_with_replacement_or_a_subset_is_kept(capsys) -> None:
    """Not a permutation of the data: replaced by one, the epochs changed size and content."""
    data = _dataset(10)
    for sampler in (
        torch.utils.data.RandomSampler(data, replacement=True),
        torch.utils.data.RandomSampler(data, num_samples=4),
    ):
        loader = DataLoader(data, batch_size=2, sampler=sampler)
        assert prepare_dataloader(loader, world_size=1, rank=0) == (loader, None)


def test_a_loader_whose_workers_were_turned_off_is_rebuilt_without_worker_options() -> None:
    """A loader built with workers, then set to ``num_workers = 0`` (to debug in the main
    process): DataLoader refuses a prefetch_factor without workers, so it is not handed on."""
    loader = DataLoader(_dataset(6), batch_size=2, num_workers=2)  # prefetch_factor 2
    loader.num_workers = 0
    wrapped, _ = prepare_dataloader(loader, world_size=1, rank=0)
    assert (wrapped.num_workers, wrapped.prefetch_factor, wrapped.persistent_workers) == (
        0,
        None,
        False,
    )
    assert [int(i) for _, y in wrapped for i in y] == list(range(6))


def test_by_default_the_loader_is_one_process_of_rank_0_seeded_0() -> None:
    """Called with the loader alone: all the data, this process as rank 0 of 1, seed 0."""
    wrapped, sampler = prepare_dataloader(DataLoader(_dataset(10), batch_size=2, shuffle=True))
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (1, 0, 0)
    assert wrapped.generator.initial_seed() == 0
    assert sorted(int(i) for _, y in wrapped for i in y) == list(range(10))
    reference = ResumableSampler(10, shuffle=True, seed=0)
    assert [int(i) for _, y in wrapped for i in y] == reference.indices()


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_drops_each_ranks_uneven_tail_of_samples(drop_last: bool) -> None:
    """drop_last reaches the sampler: 10 samples over 3 ranks are 3 each (the tail dropped),
    not 4 each (padded with repeats)."""
    loader = DataLoader(_dataset(10), batch_size=1, drop_last=drop_last)
    wrapped, sampler = prepare_dataloader(loader, world_size=3, rank=2, seed=4)
    assert sampler.drop_last is drop_last and sampler.seed == 4
    assert len(sampler) == len(wrapped) == (3 if drop_last else 4)


@pytest.mark.parametrize(
    ("world_size", "rank", "shown"),
    [(2, 0, KEPT_SAMPLER), (3, 0, KEPT_SAMPLER), (2, 1, ""), (1, 0, "")],
)
def test_a_kept_user_sampler_is_warned_of_once_by_rank_0_of_a_group(
    monkeypatch: pytest.MonkeyPatch, world_size: int, rank: int, shown: str
) -> None:
    """The warning is in the job log at once (flushed), from rank 0 only, and only when there
    are several ranks to shard over; the loader is returned untouched either way."""
    out = job_log(monkeypatch, data_module)
    ds = _dataset(8)
    loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, 0))
    assert prepare_dataloader(loader, world_size, rank) == (loader, None)
    assert out.shown == out.getvalue() == shown


def test_the_warning_comes_from_rank_0_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a rank the caller is rank 0, which warns."""
    out = job_log(monkeypatch, data_module)
    loader = DataLoader(_dataset(4), batch_size=2, shuffle=True)
    assert prepare_dataloader(loader, world_size=2, replace_sampler=False) == (loader, None)
    assert out.shown == KEPT_SAMPLER


@pytest.mark.parametrize(
    ("strategy", "world_size", "local_world_size", "cuda", "message"),
    [
        (
            "deepspeed",
            1,
            1,
            False,
            "--strategy expects one of ddp, dp, ddp2, fsdp, got 'deepspeed'",
        ),
        (
            "dp",
            4,
            2,
            True,
            "--strategy dp runs in ONE process (DataParallel over the node's GPUs) but this "
            "launch has 4 processes; use --strategy ddp for several processes or nodes, or "
            "start dp with plain 'python' (one task)",
        ),
        (
            "ddp2",
            4,
            2,
            True,
            "--strategy ddp2 runs one process per node using all its GPUs but this node has 2 "
            "processes; launch with srun --ntasks-per-node=1 (or torchrun --nproc-per-node=1), "
            "or use --strategy ddp",
        ),
    ],
)
def test_a_refused_layout_says_what_would_work(
    strategy: str, world_size: int, local_world_size: int, cuda: bool, message: str
) -> None:
    """The exact message of each refusal (what the user reads at launch)."""
    with pytest.raises(StrategyError) as refused:
        check_strategy(strategy, world_size, local_world_size, cuda)
    assert str(refused.value) == message


def test_strategy_checks_ddp2_against_the_nodes_process_count_on_gpus_only() -> None:
    """Strategy hands check_strategy the node's process count and whether its device is a GPU
    (a cuda device is only named here: nothing runs on it): ddp2 with 2 processes on a GPU
    node is refused, on CPU it runs (an all-reduce across the processes)."""
    gpu = SimpleNamespace(world_size=2, local_world_size=2, device=torch.device("cuda", 0))
    with pytest.raises(StrategyError) as refused:
        Strategy("ddp2", gpu)
    assert "but this node has 2 processes" in str(refused.value)
    one_per_node = SimpleNamespace(
        world_size=2, local_world_size=1, device=torch.device("cuda"), devices=[0]
    )
    assert Strategy("ddp2", one_per_node).name == "ddp2"
    assert Strategy("ddp2", _ctx(world_size=2)).name == "ddp2"


def test_fsdp_without_fully_shard_names_the_torch_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older torch (faked: ``fully_shard`` removed from torch.distributed.fsdp) is refused
    with the version needed and the strategy that works instead."""
    monkeypatch.delattr(fsdp, "fully_shard")
    with pytest.raises(StrategyError) as refused:
        Strategy("fsdp", _ctx())
    assert str(refused.value) == (
        f"--strategy fsdp needs torch.distributed.fsdp.fully_shard (torch >= {MIN_TORCH}); "
        f"this torch is {torch.__version__}: upgrade torch or use --strategy ddp"
    )


@pytest.mark.parametrize(
    ("name", "world_size", "initialized"),
    [
        (name, world_size, initialized)
        for name in ("ddp", "dp", "ddp2", "fsdp")
        for world_size in (1, 2)
        for initialized in (False, True)
        if not (name == "dp" and world_size > 1)  # dp refuses several processes
    ],
)
def test_distributed_only_with_several_ranks_in_a_group_and_ddp2_then_syncs_gradients(
    monkeypatch: pytest.MonkeyPatch, name: str, world_size: int, initialized: bool
) -> None:
    """A strategy is distributed when the launch has several ranks and a process group is up
    (``dist.is_initialized`` faked); ddp2 then all-reduces the gradients itself, the others
    never (DDP and FSDP do it). The fsdp wrap policy given is the one kept."""
    monkeypatch.setattr(strategy_module.dist, "is_initialized", lambda: initialized)
    strategy = Strategy(name, _ctx(world_size=world_size), fsdp_wrap=(nn.Linear,))
    distributed = world_size > 1 and initialized
    assert strategy.distributed is distributed
    assert strategy.needs_grad_sync is (name == "ddp2" and distributed)
    assert strategy.fsdp_wrap == (nn.Linear,)


@pytest.mark.parametrize("fake_group", [(1, 2)], indirect=True)
def test_a_sharded_checkpoint_is_read_into_this_ranks_own_state(
    fake_group,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As rank 1 of a fake group of 2 (ddp), loading a sharded checkpoint folder hands
    torch.distributed.checkpoint.load this rank's own model and optimizer state to fill (rank
    1's whole state is empty: nothing would be read), then loads what was read. dcp.load is
    faked: it fills that state from a trained model, as reading the folder would."""
    source, source_opt = _trained(0)
    by_name = dict(source.named_parameters())
    read: list = []

    def load(state: dict, checkpoint_id: str) -> None:
        read.append((sorted(state["model"]), sorted(state["optimizer"].get("state", {}))))
        read.append(checkpoint_id)
        for name, tensor in state["model"].items():
            tensor.copy_(by_name[name].detach())
        for name, entry in state["optimizer"].get("state", {}).items():
            for key, value in entry.items():
                value.copy_(source_opt.state[by_name[name]][key])

    class Folder:  # its metadata: the optimizer state of every parameter was saved
        def __init__(self, path: str) -> None:
            assert path == "ck/step5.dcp"

        def read_metadata(self) -> SimpleNamespace:
            saved = {
                f"optimizer.state.{name}.{key}"
                for name, p in by_name.items()
                for key in source_opt.state[p]
            }
            return SimpleNamespace(state_dict_metadata=saved)

    monkeypatch.setattr(dcp, "load", load)
    monkeypatch.setattr(dcp, "FileSystemReader", Folder)
    strategy = Strategy("ddp", _ctx(world_size=2, rank=1))
    assert strategy.distributed
    model, opt = _trained(1)
    strategy.load(model, opt, {"model": None, "optimizer": None, "sharded": "ck/step5.dcp"})
    names = ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert read == [(names, names), "ck/step5.dcp"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), source.parameters()))
    assert _same_optimizer_state(opt, source_opt)


@pytest.mark.parametrize("strategy", ["dp", "ddp2"])
def test_bf16_with_dataparallel_over_several_gpus_is_refused_before_touching_them(
    strategy: str,
) -> None:
    """DataParallel runs each replica in a thread that enters autocast without a dtype, and
    the dtype is per thread: bf16-mixed ran in float16 there, without a scaler (no GPU here:
    the context names two and nothing may touch them)."""
    from hpc_harness.precision import PrecisionError
    from hpc_harness.trainer import TrainConfig, Trainer

    ctx = SimpleNamespace(
        rank=0, world_size=1, local_world_size=1, is_main=True,
        device=torch.device("cuda", 0), devices=[0, 1],
    )  # fmt: skip
    cfg = TrainConfig(strategy=strategy, precision="bf16-mixed")
    loader = DataLoader(_dataset(4), batch_size=2)
    with pytest.raises(PrecisionError) as refused:
        Trainer(nn.Linear(1, 2), lambda p: torch.optim.SGD(p, lr=0.1), loader, ctx, cfg)
    assert str(refused.value) == (
        f"--precision bf16-mixed does not reach DataParallel's replicas (--strategy {strategy} "
        "on 2 GPUs): torch runs each in a thread that autocasts to float16, without a scaler; "
        "use --strategy ddp, or --precision 16-mixed"
    )


def test_loaders_with_workers_get_the_shield_once_and_keep_the_users_init() -> None:
    from hpc_harness.signals import shielded_worker_init

    def users_init(worker_id: int) -> None: ...

    data = TensorDataset(torch.arange(8.0))
    replaced, _ = prepare_dataloader(DataLoader(data, num_workers=1, worker_init_fn=users_init))
    kept, _ = prepare_dataloader(
        DataLoader(data, num_workers=1, worker_init_fn=users_init), replace_sampler=False
    )
    for loader in (replaced, kept):
        init = loader.worker_init_fn
        assert (init.func, init.args) == (shielded_worker_init, (users_init,))
        assert data_module.shield_workers(loader).worker_init_fn is init  # not wrapped twice
    without_workers, _ = prepare_dataloader(DataLoader(data, worker_init_fn=users_init))
    assert without_workers.worker_init_fn is users_init  # nothing runs in another process


@pytest.mark.parametrize("persistent", [False, True])
def test_a_shielded_loaders_workers_are_born_with_the_stop_signals_blocked(
    tmp_path, monkeypatch, persistent: bool
) -> None:
    """A plain ``for batch in loader`` (the pieces recipe) forked workers that took SLURM's
    signals until their worker_init_fn blocked them: a SIGTERM to every process of the step
    in that window ended a worker ("DataLoader worker ... exited unexpectedly") and the
    training crashed without a checkpoint (19 epochs out of 20 in a reproduction)."""
    from torch.utils.data._utils import worker

    masks = tmp_path / "masks"
    worker_loop = worker._worker_loop

    def recording_loop(*args, **kwargs) -> None:  # the worker's first code (fork: inherited)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with open(masks, "a") as f:
            f.write(" ".join(str(int(s)) for s in blocked) + "\n")
        worker_loop(*args, **kwargs)

    monkeypatch.setattr(worker, "_worker_loop", recording_loop)
    loader = data_module.shield_workers(
        DataLoader(
            TensorDataset(torch.arange(4.0)),
            num_workers=1,
            multiprocessing_context="fork",
            persistent_workers=persistent,
        )
    )
    mask_here = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    for _ in range(2):  # each iterator starts its workers (persistent ones: the first)
        assert [x.item() for (x,) in loader] == [0.0, 1.0, 2.0, 3.0]
    births = masks.read_text().splitlines()
    assert len(births) == (1 if persistent else 2)
    for mask in births:
        assert {int(signal.SIGTERM), int(signal.SIGUSR1)} <= set(map(int, mask.split())), mask
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_here  # here: only meanwhile


def test_slurms_signals_at_a_workers_birth_neither_end_it_nor_its_parents_sigterm() -> None:
    """SIGTERM and SIGUSR1 from another process (slurmstepd signals every process of a step)
    as soon as the workers exist: the epoch goes on; the worker's waiter thread takes them
    and still ends the worker at its parent's SIGTERM, torch's way to stop one."""
    loader = data_module.shield_workers(
        DataLoader(
            TensorDataset(torch.arange(8.0)),
            batch_size=2,
            num_workers=2,
            multiprocessing_context="fork",
            persistent_workers=True,
        )
    )
    batches = iter(loader)
    workers = list(batches._workers)
    for name in ("TERM", "USR1"):
        subprocess.run(["kill", f"-{name}", *(str(w.pid) for w in workers)], check=True)
    assert sorted(x for (b,) in batches for x in b.tolist()) == [float(i) for i in range(8)]
    assert all(w.is_alive() for w in workers)
    os.kill(workers[0].pid, signal.SIGTERM)  # from its parent
    workers[0].join(30)
    assert workers[0].exitcode == 0
    batches._shutdown_workers()


def test_shielding_keeps_the_users_loader_class_and_happens_once() -> None:
    class Batches(DataLoader):
        def users_method(self) -> str:
            return "kept"

    data = TensorDataset(torch.arange(4.0))
    loader = data_module.shield_workers(Batches(data, num_workers=1))
    assert isinstance(loader, Batches) and loader.users_method() == "kept"
    assert type(loader).__name__ == "ShieldedBatches"  # what a traceback shows
    shielded, init = type(loader), loader.worker_init_fn
    assert data_module.shield_workers(loader) is loader
    assert (type(loader), loader.worker_init_fn) == (shielded, init)  # not wrapped twice
    assert type(data_module.shield_workers(Batches(data, num_workers=1))) is shielded
    assert type(data_module.shield_workers(DataLoader(data))) is DataLoader  # no workers


BIRTH_MASKS = """
import os, signal, sys, torch
from torch.utils.data import DataLoader, Dataset
from hpc_harness.data import shield_workers

class Recording(Dataset):  # unpickled in each worker before any of torch's worker code
    def __init__(self):
        self.items = [0, 1]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        return self.items[i]
    def __setstate__(self, state):
        mask = " ".join(str(int(s)) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        os.write(1, f"{mask}\\n".encode())  # one write: the workers print side by side
        self.__dict__.update(state)

if __name__ == "__main__":
    context = sys.argv[1]
    loader = DataLoader(Recording(), num_workers=2, multiprocessing_context=context)
    assert list(shield_workers(loader)) == [0, 1]
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_the_first_spawned_or_forkserver_workers_are_born_with_the_stop_signals_blocked(
    tmp_path, context: str
) -> None:
    """Python starts its resource tracker at a process's first spawn or forkserver, and
    unblocks SIGTERM (and SIGINT) in the caller as it does: the first iterator's workers (a
    forkserver's, all of them) were born taking SLURM's SIGTERM, and died of it."""
    script = tmp_path / "birth_masks.py"
    script.write_text(BIRTH_MASKS)
    run = subprocess.run(
        [PY, str(script), context],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr
    births = run.stdout.splitlines()
    assert len(births) == 2, run.stdout
    for mask in births:
        assert {int(signal.SIGTERM), int(signal.SIGUSR1)} <= set(map(int, mask.split())), mask
