"""mha.torch under DistributedDataParallel (Gloo, CPU processes): the model of
examples/ddp_train.py trained on 2 and 4 processes, each with a slice of
every batch, ends with the parameters of one process trained on the whole
batches (within 1e-5): DDP's averaged gradients are the whole batch's."""
import pathlib
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

import mha

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import ddp_train  # noqa: E402

STEPS = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_process(steps):
    torch.manual_seed(0)
    model = ddp_train.Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, mask, target in ddp_train.batches(steps, 8, 6, 32, 5):
        loss = nn.functional.cross_entropy(model(x, mask), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch without Gloo")
@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_over_gloo_trains_as_one_process_on_the_whole_batch(world_size, tmp_path):
    threads = mha.get_num_threads(), torch.get_num_threads()
    want = one_process(STEPS)
    mha.set_num_threads(threads[0])
    torch.set_num_threads(threads[1])
    result = tmp_path / "rank0.pt"
    mp.spawn(ddp_train.train, args=(world_size, STEPS, free_port(), str(result)), nprocs=world_size, join=True)
    got = torch.load(result)
    assert set(got) == set(want)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=1e-5, msg=name)
    # The training moved the parameters (the comparison is not of two initial states).
    torch.manual_seed(0)
    initial = ddp_train.Block().state_dict()
    assert max((want[n] - initial[n]).abs().max().item() for n in want) > 1e-3
