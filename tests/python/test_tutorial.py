"""docs/tutorial.md's Python blocks run, in order, in one namespace, from the
repository root: the tutorial cannot drift from what the library does."""
import os
import pathlib
import re
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def test_tutorial_python_blocks_run(monkeypatch):
    text = (ROOT / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 3
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": "tutorial"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's lazy-module notice
        for i, block in enumerate(blocks):
            try:
                exec(compile(block, f"docs/tutorial.md python block {i + 1}", "exec"), namespace)
            except Exception as e:  # name the block in the failure
                raise AssertionError(f"docs/tutorial.md python block {i + 1} failed: {e!r}") from e
    assert os.environ.get("MHA_BUILD") or (ROOT / "build" / "mha").exists()
