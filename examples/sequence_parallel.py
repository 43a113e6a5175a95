"""Sequence parallelism for PyTorch users: the d2l chapter's attention over a sequence split across
Gloo CPU processes (mha.torch.distributed.SequenceParallel), causal, in zigzag order.

    /usr/bin/python3 examples/sequence_parallel.py --world-size 2 --length 64

Each process holds its positions (chunks r and 2P-1-r of 2P), computes its rows of the output and,
after backward, its block of the input's gradient; rank 0 checks both against one process on the
whole sequence and prints the largest difference.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mha
import mha.torch
import mha.torch.distributed as mtd


def run(rank, world_size, length, port):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    mha.set_num_threads(1)
    torch.manual_seed(0)  # the same module and inputs on every rank
    attn = mha.torch.MultiHeadAttention(32, 4, 0.0)
    x = torch.randn(2, length, 32)
    attn(x[:, :1], x[:, :1], x[:, :1])  # materialise the lazy projections
    xs = mtd.shard(x, 1, rank, world_size, zigzag=True).requires_grad_()
    y = mtd.SequenceParallel(attn, zigzag=True)(xs, xs, xs, causal=True)
    y.sum().backward()
    ys = [torch.empty_like(y) for _ in range(world_size)]
    gs = [torch.empty_like(xs) for _ in range(world_size)]
    dist.all_gather(ys, y.detach())
    dist.all_gather(gs, xs.grad)
    if rank == 0:
        whole = x.clone().requires_grad_()
        lens = torch.arange(1, length + 1, dtype=torch.float32).expand(2, length).contiguous()
        want = attn(whole, whole, whole, lens)
        want.sum().backward()
        print(f"{world_size} processes, L {length}: output differs by "
              f"{(mtd.unshard(ys, 1, True) - want).abs().max().item():.2e}, input gradient by "
              f"{(mtd.unshard(gs, 1, True) - whole.grad).abs().max().item():.2e} from one process")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args()
    mp.spawn(run, args=(args.world_size, args.length, args.port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
