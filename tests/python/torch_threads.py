"""One PyTorch thread during a test module's tests (import the fixture into it).

The cases are tiny: PyTorch's thread pool costs more than it saves on two
shared cores, and its busy-waiting threads would take mha's cores."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
