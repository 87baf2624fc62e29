"""Example: nanoGPT's train.py on the Trainer: a tiny GPT, random windows of a token array
(``get_batch``), weight-decay groups, cosine LR with warmup, evaluation every eval_interval.

The token array is charlm's small grammar (nothing to download), split 90/10 as nanoGPT does.
An epoch is ``--eval-interval`` iterations; the validation loss is logged at each epoch's end.
The windows are drawn once from the seed, so a resume reads what the uninterrupted run read.

    python -m hpc_harness.examples.nanogpt --max-iters 100
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m hpc_harness.examples.nanogpt
    ./hpc_files/job_submitter.sh -n 2 -g 2 -W torchrun -- python -m hpc_harness.examples.nanogpt

Exit codes: 0 finished, 42 checkpointed at SIGUSR1/SIGTERM (requeue me), 1 an error (a
RunMismatch naming the setting: another run's ``--ckpt-dir``). Re-running the same command
resumes from the newest checkpoint; a resume at another world size is another run (an
epoch's windows are counted per rank).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import dist
from hpc_harness.examples import faults
from hpc_harness.examples.charlm import Block, CharWindows, make_text
from hpc_harness.optim import warmup_cosine, weight_decay_groups
from hpc_harness.signals import exit_code
from hpc_harness.trainer import TrainConfig

# --------------------------------------------------------------------------- model


class GPT(nn.Module):
    """nanoGPT's GPT, small: token and position embeddings, blocks, final norm, a head tied to
    the token embedding (charlm's Block: causal attention, MLP, dropout)."""

    def __init__(self, vocab: int, block_size: int, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, dim),
                wpe=nn.Embedding(block_size, dim),
                h=nn.ModuleList([Block(dim, heads) for _ in range(layers)]),
                ln_f=nn.LayerNorm(dim),
            )
        )
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying
        for module in self.modules():  # nanoGPT's init: small weights, a loss near ln(vocab)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


# --------------------------------------------------------------------------- training

# The flags that may change across a resume without making it another run.
RESUME_FREE = ("ckpt_dir", "eval_workers", *faults.FLAGS)
# nanoGPT's settings, each a flag (--max-iters 500)
ITERS = dict(max_iters=100, eval_interval=25, warmup_iters=10, eval_workers=1, seed=0)
SHAPES = dict(batch_size=16, block_size=32, learning_rate=3e-3, min_lr=3e-4, weight_decay=0.1)


def random_windows(tokens: torch.Tensor, block: int, n: int, seed: int) -> TensorDataset:
    """nanoGPT's get_batch, drawn once from ``seed``: ``n`` random windows (inputs, targets).
    The sampler shuffles and shards them; a resumed run reads what this one would."""
    g = torch.Generator().manual_seed(seed)
    w = tokens.unfold(0, block + 1, 1)[torch.randint(len(tokens) - block, (n,), generator=g)]
    return TensorDataset(w[:, :-1], w[:, 1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m hpc_harness.examples.nanogpt")
    for name, default in {**ITERS, **SHAPES, "ckpt_dir": "out-nanogpt"}.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    faults.add_flags(p)  # the tests' hidden flags (faults.py)
    args = p.parse_args(argv)
    ctx = dist.setup()
    try:
        text = CharWindows(make_text(2000), 1)  # .ids, the token array (nanoGPT: train.bin)
        n = int(0.9 * len(text.ids))  # the first nine tenths train, the last tenth evaluates
        per_epoch = args.eval_interval * args.batch_size * ctx.world_size  # an epoch's windows
        train = random_windows(text.ids[:n], args.block_size, per_epoch, args.seed)
        val = random_windows(text.ids[n:], args.block_size, 256, args.seed + 1)
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        # epochs of eval_interval steps (evaluated at each one's end), max_steps, seed
        cfg = TrainConfig(math.ceil(args.max_iters / args.eval_interval), args.max_iters, args.seed)
        cfg.hparams, cfg.resume_free, cfg.ckpt_dir = vars(args), RESUME_FREE, args.ckpt_dir
        adamw = functools.partial(torch.optim.AdamW, lr=args.learning_rate, betas=(0.9, 0.95))
        lr = warmup_cosine(args.warmup_iters, args.max_iters, args.min_lr / args.learning_rate)
        trainer = faults.trainer(
            faults.Faults.from_args(args),
            GPT(len(text.chars), args.block_size),
            lambda params: adamw(weight_decay_groups(params, args.weight_decay)),
            DataLoader(train, batch_size=args.batch_size, shuffle=True),
            ctx,
            cfg,
            make_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr),
            loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
            eval_data=DataLoader(val, batch_size=args.batch_size, num_workers=args.eval_workers),
        )
        return exit_code(trainer.train())  # RunMismatch: another run's --ckpt-dir
    finally:
        dist.cleanup()


if __name__ == "__main__":
    sys.exit(main())
