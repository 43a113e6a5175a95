"""Data parallelism for PyTorch users: a model with mha.torch attention inside
torch.nn.parallel.DistributedDataParallel, over Gloo on CPU processes.

    /usr/bin/python3 examples/ddp_train.py --world-size 2 --steps 20

Each process holds a replica of the model and a slice of every batch; DDP
all-reduces (averages) the gradients after each backward, so every replica
takes the same optimiser step as one process on the whole batch would.
mha.torch's modules are ordinary nn.Modules (their Parameters are torch's),
so DDP needs nothing from mha: each call reads the current Parameters and
autograd returns their gradients to DDP's hooks. Give each process one mha
thread (mha.set_num_threads(1)) and one torch thread when the processes
fill the cores.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import mha
import mha.torch


class Block(nn.Module):
    """Self-attention (the drop-in) and a read-out: enough to show DDP at work."""

    def __init__(self, embed_dim=32, num_heads=4, classes=5):
        super().__init__()
        self.attn = mha.torch.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.out = nn.Linear(embed_dim, classes)

    def forward(self, x, key_padding_mask=None):
        y, _ = self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)
        return self.out(y + x).mean(dim=1)


def batches(steps, batch, length, embed_dim, classes, seed=0):
    """The same (x, mask, target) batches in every process."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch, length, embed_dim, generator=g)
        lengths = torch.randint(1, length + 1, (batch,), generator=g)
        mask = torch.arange(length)[None, :] >= lengths[:, None]  # True = padding
        yield x, mask, torch.randint(0, classes, (batch,), generator=g)


def train(rank, world_size, steps, port, result_path=None):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    mha.set_num_threads(1)
    torch.manual_seed(0)  # the same initial replica everywhere (DDP also broadcasts rank 0's)
    model = nn.parallel.DistributedDataParallel(Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_rank = 8 // world_size
    for x, mask, target in batches(steps, 8, 6, 32, 5):
        mine = slice(rank * per_rank, (rank + 1) * per_rank)  # this process's slice of the batch
        loss = nn.functional.cross_entropy(model(x[mine], mask[mine]), target[mine])
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the processes here
        opt.step()
    if rank == 0:
        print(f"trained {steps} steps on {world_size} processes; last loss on rank 0: {loss.item():.4f}")
        if result_path:
            torch.save(model.module.state_dict(), result_path)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2, choices=(1, 2, 4, 8))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    mp.spawn(train, args=(args.world_size, args.steps, args.port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
