"""Shared pytest set-up: the built module and tool, and PyTorch's threads."""
import os
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = pathlib.Path(os.environ.get("MHA_BUILD", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))
sys.path.insert(0, str(HERE))

torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def mha_tool():
    """Path of the built command-line tool."""
    path = BUILD / "mha"
    if not path.exists():
        pytest.fail(f"the mha tool is not built at {path}; run `make build` first")
    return str(path)
