"""README.md's Python blocks run, in order, in one namespace (in a
temporary folder, since they write files): every snippet a newcomer copies
is self-contained and true, as docs/tutorial.md's are (test_tutorial.py)."""
import pathlib
import re
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("page", ["README.md", "docs/usage.md"])
def test_readme_python_blocks_run(monkeypatch, tmp_path, page):
    """The README and docs/usage.md, the page it sends readers to next."""
    text = (ROOT / page).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    import torch
    import torch.distributed as dist

    had_group = dist.is_available() and dist.is_initialized()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, block in enumerate(blocks):
                if block.startswith("# torch 2.x") and torch.__version__.startswith("1."):
                    continue  # a block for the torch 2.x line (compile, export, transformers)
                try:
                    exec(compile(block, f"{page} python block {i + 1}", "exec"), namespace)
                except Exception as e:  # name the block in the failure
                    raise AssertionError(f"{page} python block {i + 1} failed: {e!r}") from e
    finally:  # the distributed example starts a group of one; later tests start their own
        if not had_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def test_readme_points_to_sections_that_exist_where_it_says():
    text = (ROOT / "README.md").read_text()
    assert "see the sections above" not in text


def test_a_module_saved_as_the_readme_shows_refuses_another_head_count(mha_tool, tmp_path):
    import subprocess

    import numpy as np

    import mha
    attention = mha.MultiHeadAttention(num_hiddens=100, num_heads=5, dropout=0.5, seed=0)
    X, Y = np.ones((2, 4, 100), np.float32), np.ones((2, 6, 100), np.float32)
    attention(X, Y, Y, valid_lens=np.array([3, 2]))
    mha.save_attention(str(tmp_path / "w.safetensors"), attention)
    mha.save_safetensors(str(tmp_path / "i.safetensors"), {"queries": X, "keys": Y, "values": Y})
    run = [mha_tool, "run", "--weights", "w.safetensors", "--inputs", "i.safetensors", "--out", "o.safetensors"]
    r = subprocess.run(run + ["--heads", "4"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "--heads: 4 differs from the 5 heads" in r.stderr
    r = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_the_tutorials_file_block_is_the_file():
    """A code block introduced by a file's name shows that file's code, the
    lines whose output the tutorial prints included."""
    text = (ROOT / "docs" / "tutorial.md").read_text()
    start = text.index("examples/consumer/seed_check.cpp, a project")
    block = re.search(r"```cpp\n(.*?)```", text[start:], flags=re.S).group(1)
    assert block in (ROOT / "examples" / "consumer" / "seed_check.cpp").read_text()
    assert "std::printf" in block


def test_the_tutorials_sample_training_output_agrees_with_itself():
    text = (ROOT / "docs" / "tutorial.md").read_text()
    rates = [float(r) for r in re.findall(r"# step +\d+/500 .* ([\d.]+) steps/s", text)]
    total = re.search(r"# trained 500 steps in ([\d.]+) s \(([\d.]+) steps/s\)", text)
    reached = re.search(r"# held-out accuracy reached 99.0% at step 100 after ([\d.]+) s", text)
    seconds, rate = float(total.group(1)), float(total.group(2))
    # The tool prints the total time to 0.1 s and the rate from the unrounded time.
    assert 500 / (seconds + 0.05) <= rate <= 500 / (seconds - 0.05), (seconds, rate)
    # Each 50-step window within a factor 1.5 of the whole run's rate (the
    # first includes the start-up; a short run on a shared machine varies).
    assert rates and all(rate / 1.5 <= r <= rate * 1.5 for r in rates), (rates, rate)
    assert abs(float(reached.group(1)) - 100 / rate) < 0.3


INTERNAL = re.compile(r"\bthe seed\b(?! (?:and|of|the)\b)|\bseed's\b|\bissue's\b|\(issue \d\)", re.I)


def _docstrings(module):
    """The docstrings of a module's public objects and of their members."""
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        yield name, getattr(obj, "__doc__", None) or ""
        if isinstance(obj, type):
            for member in dir(obj):
                if not member.startswith("_") or member in ("__init__", "__call__"):
                    yield f"{name}.{member}", getattr(getattr(obj, member, None), "__doc__", None) or ""


def test_user_facing_text_uses_no_internal_words(mha_tool):
    """Help, docstrings, package metadata and README name the d2l chapter,
    not the project's internal words ("the seed", "the issue's shapes")."""
    import subprocess

    import mha
    texts = {"README.md": (ROOT / "README.md").read_text(), "pyproject.toml": (ROOT / "pyproject.toml").read_text(),
             "mha.__doc__": mha.__doc__}
    for module in (mha, mha.optim):
        for name, doc in _docstrings(module):
            texts[f"docstring of {name}"] = doc
    commands = ["", "demo", "run", "bench", "viz", "train", "prune"]
    for c in commands:
        r = subprocess.run([mha_tool, *([c] if c else []), "--help"], capture_output=True, text=True)
        texts[f"mha {c} --help"] = r.stdout
    bad = {k: INTERNAL.findall(v) for k, v in texts.items() if INTERNAL.search(v)}
    assert not bad, bad


def test_default_outputs_of_the_tool_are_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text().split()
    for name in ("model.safetensors", "curves.csv", "curves.png", "prune.csv", "prune.png", "mha-demo-heatmap.png"):
        assert f"/{name}" in ignored, name


def test_make_demo_builds_only_what_it_runs():
    make = (ROOT / "Makefile").read_text()
    demo = make[make.index("\ndemo:"):]
    demo = demo[:demo.index("\n\n")]
    assert "--target mha_tool" in demo and "demo: build" not in make
