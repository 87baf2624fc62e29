"""Example: a tiny character-level transformer trained in a plain loop with hpc_harness.pieces.

The loop is yours; the pieces make it survive SLURM: setup, a resumable sampler, checkpoint
save / load-latest (rank 0 chooses, every rank loads the same step), the stop agreement and
the requeue exit. The model (about 0.1M parameters) ties its output layer to the token
embedding (``lm_head.weight = tok.weight``, as GPT-2). The text comes from a small
deterministic grammar (:func:`make_text`): nothing to download.

Launch it like the digits example::

    python -m hpc_harness.examples.charlm --steps 200
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m hpc_harness.examples.charlm
    ./hpc_files/job_submitter.sh -n 2 -g 2 -W torchrun -- python -m hpc_harness.examples.charlm

Exit codes: 0 finished, 42 checkpointed at SIGUSR1/SIGTERM (requeue me), 2 bad arguments.
Re-running the same command resumes from the newest checkpoint in ``--ckpt-dir``.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hpc_harness import pieces as hp
from hpc_harness.checkpoint import (
    RunMismatch,
    UnsafeCheckpoint,
    fingerprint,
    past_end_error,
)
from hpc_harness.examples import faults
from hpc_harness.train import default_ckpt_dir

# The flags that may change across a resume without making it another run.
RESUME_FREE = ("steps", "ckpt_dir", "fresh", "checkpoint_every_s", "log_every", *faults.FLAGS)

# --------------------------------------------------------------------------- data


def make_text(sentences: int = 600, seed: int = 0) -> str:
    """Sentences from a small grammar, the same for a given seed on every machine."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the bird", "a child"]
    verbs = ["sees", "likes", "finds", "follows", "hears", "draws"]
    objects = ["the moon", "a red ball", "the river", "an apple", "the small house", "a song"]
    places = ["in the garden", "at night", "by the sea", "after school", "on the hill"]
    lines = []
    for _ in range(sentences):
        words = [rng.choice(subjects), rng.choice(verbs), rng.choice(objects)]
        if rng.random() < 0.5:
            words.append(rng.choice(places))
        lines.append(" ".join(words) + ".")
    return "\n".join(lines) + "\n"


class CharWindows(Dataset):
    """Windows of ``block + 1`` characters (input and its shift by one), one every ``block``."""

    def __init__(self, text: str, block: int) -> None:
        self.chars = sorted(set(text))
        self.ids = torch.tensor([self.chars.index(c) for c in text], dtype=torch.long)
        self.block = block

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.ids[i * self.block : (i + 1) * self.block + 1]
        return w[:-1], w[1:]


# --------------------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.1)  # randomness a resume must continue exactly

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharLM(nn.Module):
    def __init__(self, vocab: int, block: int, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied embeddings

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.lm_head(self.ln(self.blocks(x)))


# --------------------------------------------------------------------------- the loop


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpc_harness.examples.charlm",
        description="A tiny character-level transformer in a plain loop (exit 42 = requeue).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=16, help="per-process batch size")
    p.add_argument("--block", type=int, default=32, help="context length (characters)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=None, help=f"default: {default_ckpt_dir()}")
    p.add_argument(
        "--fresh", action="store_true", help="move an earlier run's --ckpt-dir aside, start over"
    )
    p.add_argument("--checkpoint-every-s", type=float, default=600.0, help="0: only at a stop")
    p.add_argument(
        "--log-every", type=int, default=20, help="steps between progress lines, 0: none"
    )
    faults.add_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    provoked = faults.Faults.from_args(args)
    ckpt_dir = args.ckpt_dir or default_ckpt_dir()
    ctx = hp.setup()
    try:
        data = CharWindows(make_text(), args.block)
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        model = CharLM(len(data.chars), args.block).to(ctx.device)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        torch.manual_seed(args.seed + ctx.rank)  # each rank its own dropout masks
        sampler = hp.ResumableSampler(len(data), ctx.world_size, ctx.rank, seed=args.seed)
        # its own generator: starting an epoch must not draw from the global RNG (dropout's)
        loader = DataLoader(
            data, args.batch_size, sampler=sampler, drop_last=True, generator=torch.Generator()
        )
        steps_per_epoch = len(loader)
        run = fingerprint(vars(args), RESUME_FREE)  # other arguments: RunMismatch at a resume
        if args.fresh:  # not this job's own folder at a requeue
            hp.start_fresh(ckpt_dir)
        try:
            state = hp.load_checkpoint(ckpt_dir, fingerprint=run)
        except (RunMismatch, UnsafeCheckpoint) as exc:
            if ctx.is_main:
                print(f"hpc_harness: error: {exc}", file=sys.stderr, flush=True)
            return 2
        step = 0
        if state is not None and state["world_size"] != ctx.world_size:
            if ctx.is_main:  # the position below is a step count: the same ranks only
                print(
                    f"hpc_harness: error: {state['path']} was written by {state['world_size']} "
                    "ranks; this loop resumes with as many (its position is a step count): run "
                    f"with {state['world_size']}, or start another --ckpt-dir",
                    file=sys.stderr,
                    flush=True,
                )
            return 2
        if state is not None and state["global_step"] > args.steps:
            if ctx.is_main:  # a longer run's: its model is not this run's result
                error = past_end_error(ckpt_dir, state["global_step"], "--steps", args.steps)
                print(f"hpc_harness: error: {error}", file=sys.stderr, flush=True)
            return 2
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step = state["global_step"]
        stop = hp.StopAgreement(ctx, checkpoint_every_s=args.checkpoint_every_s).install()
        loss_sum, summed = torch.zeros((), device=ctx.device), 0

        def save() -> str:
            keep = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            saved = {**keep, "global_step": step, "fingerprint": run, "world_size": ctx.world_size}
            write = functools.partial(provoked.write, step=step)  # faults.py: a held save
            path = hp.save_checkpoint(ckpt_dir, saved, step, write=write)
            stop.saved()
            return path

        while step < args.steps:
            epoch, start = divmod(step, steps_per_epoch)
            sampler.set_epoch(epoch)
            sampler.set_start(start * args.batch_size)
            # the workers' seeds (augmentations): another on each rank and epoch, and the
            # uninterrupted run's at a resume (the generator itself is not saved)
            loader.generator.manual_seed(sampler.worker_seed())
            for x, y in loader:
                x, y = x.to(ctx.device), y.to(ctx.device)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                # one all-reduce in a fixed order (DDP regroups its buckets after the first
                # step, and above 2 ranks a resumed run would then round differently)
                hp.average_gradients(model, ctx.world_size)
                opt.step()
                step += 1
                loss_sum += loss.detach()
                summed += 1
                provoked.after_step(step, ctx.rank)
                if args.log_every and step % args.log_every == 0:
                    if ctx.is_main:  # rank 0's mean loss since the last line (or the resume)
                        hp.say(
                            f"hpc_harness: step {step}/{args.steps} epoch {epoch} "
                            f"loss {loss_sum.item() / summed:.4f}"
                        )
                    loss_sum, summed = loss_sum.zero_(), 0
                if stop.should_stop():
                    hp.requeue_exit(step, epoch, save(), stop)
                if stop.checkpoint_due:
                    save()
                if step >= args.steps:
                    break
        if state is None or state["global_step"] != step:
            save()
        last = hp.save_final(ckpt_dir, {"model": model.state_dict(), "global_step": step})
        if ctx.is_main:
            hp.say(f"hpc_harness: finished at global step {step}; model in {last}")
        return 0
    finally:
        hp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
