"""Every entry point refuses an argument that is not a number by its name.

bad_types_walk.py enumerates the entry points of mha, mha._core (private
ones included), mha.optim, mha.plot and mha.torch by introspection, and calls
each with valid arguments except one, replaced by a string, bytes, a dict, an
object, None (where None is not a valid value), a ragged list, a list of
strings, an object array or an array of strings. Each call runs in a child
process that is started again after a crash, so a segmentation fault is
reported as the call that caused it.

The second walk (--ints) gives every integer argument integers past 32, 63
and 64 bits and negative ones: each is refused with a ValueError naming the
argument and its range (never pybind11's "incompatible function arguments",
never a crash or a bare bad_alloc), or is valid there (a seed below 2**64).

Each such call of the first walk must raise a TypeError (mha.ArgumentTypeError, also a
ValueError, for mha's own checks) whose message starts with the operation in
brackets and then names the argument: never a crash, never another error,
never a string read as a number.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import mha

WALK = pathlib.Path(__file__).resolve().parent / "bad_types_walk.py"


def run_walk(cwd, mode=()):
    """(results, crashes): every call's outcome, and the calls that crashed the child."""
    results, crashes, first = [], [], 0
    while True:
        r = subprocess.run([sys.executable, str(WALK), *mode, str(first)], capture_output=True, text=True,
                           timeout=900, cwd=cwd, env=dict(os.environ))
        started, done = None, False
        for line in r.stdout.splitlines():
            if line.startswith("START "):
                started = line
            elif line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
                started = None
            elif line.startswith("DONE "):
                done = True
        if done and r.returncode == 0:
            return results, crashes
        assert started is not None, f"the walk failed outside a call (status {r.returncode}):\n{r.stderr[-4000:]}"
        crashes.append(f"{started[len('START '):]}: exit status {r.returncode}\n{r.stderr[-1500:]}")
        first = int(started.split()[1]) + 1


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    return run_walk(tmp_path_factory.mktemp("walk"))


def test_no_entry_point_crashes_on_an_argument_that_is_not_a_number(walk):
    results, crashes = walk
    assert len(results) > 1000, "the walk made too few calls to mean anything"
    assert not crashes, "crashed:\n" + "\n".join(crashes)


def test_every_entry_point_that_takes_numbers_has_valid_arguments_to_walk_from():
    r = subprocess.run([sys.executable, str(WALK), "--list"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    entries = [json.loads(line) for line in r.stdout.splitlines()]
    labels = {e["label"] for e in entries}
    for expected in ("MultiHeadAttention.set_grads", "AttentionModel.load_state_dict", "head_offsets",
                     "_render_line_chart", "optim.Adam", "show_heatmaps"):
        assert expected in labels, f"the enumeration misses {expected}"
    missing = [e["label"] for e in entries if e["poisoned"] and not e["has_good"]]
    assert not missing, f"entry points without valid arguments in bad_types_walk.GOOD: {missing}"


def named(result):
    """Whether the message starts with the operation in brackets, then the argument."""
    first = result["message"].splitlines()[0] if result["message"] else ""
    ops = result["op"] if isinstance(result["op"], list) else [result["op"]]
    for op in ops:
        prefix = f"[{op}] "
        if first.startswith(prefix) and re.match(re.escape(result["arg"]) + r"(:|\[| )", first[len(prefix):]):
            return True
    return False


def test_every_argument_that_is_not_a_number_is_a_type_error_naming_it(walk):
    results, _ = walk
    problems = []
    for r in results:
        what = f"{r['label']}({r['arg']}={r['poison']})"
        if r["outcome"] == "accepted":
            problems.append(f"{what}: accepted")
        elif "TypeError" not in r["mro"]:
            problems.append(f"{what}: {r['type']}: {r['message'][:200]}")
        elif not named(r):
            problems.append(f"{what}: the message does not start with [{r['op']}] {r['arg']}: {r['message'][:200]}")
    assert not problems, f"{len(problems)} of {len(results)} calls:\n" + "\n".join(problems[:80])


def test_the_error_is_both_a_type_error_and_mhas_value_error():
    m = mha.MultiHeadAttention(8, 2)
    x = np.ones((1, 3, 4), np.float32)
    m(x, x, x)
    with pytest.raises(mha.ArgumentTypeError) as err:
        m.set_grads({"W_q.weight": "abc"})
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    assert str(err.value) == ("[MultiHeadAttention.set_grads] grads['W_q.weight']: got str, wanted an array of "
                              "numbers (bool, integer or floating)")
    with pytest.raises(TypeError, match=r"^\[head_offsets\] valid_lens: dtype <U2 is not a real number type"):
        mha.head_offsets(m.attention_weights, np.array(["ab", "cd"]))
    with pytest.raises(TypeError, match=r"^\[MultiHeadAttention\] num_heads: got str, wanted an integer$"):
        mha.MultiHeadAttention(8, "2")
    with pytest.raises(TypeError, match=r"^\[mha.optim.Adam\] betas: got bytes, wanted a pair of real numbers$"):
        mha.optim.Adam(m, betas=b"12")


def test_arguments_pybind11_converts_are_still_converted():
    # The overload that names a bad argument must not stop a conversion
    # pybind11 makes on its second pass (an int for a float, numpy scalars).
    m = mha.MultiHeadAttention(np.int64(8), 2, dropout=0, seed=np.uint8(3))
    m.initialize(np.int32(4), 4, 4)
    m._set_dropout(0)
    mha.optim.SGD(m, lr=1, momentum=np.float32(0.5))
    mha.optim.Adam(m, betas=[0.9, 0.99])
    mha.optim.AdamW(m, betas=(np.float64(0.8), 0.9))
    mha.DotProductAttention(dropout=0)
    mha.optim.clip_grad_norm(m, 1)
    assert m.num_hiddens == 8 and m.dropout == 0.0


def test_a_mistyped_keyword_is_still_named_alone():
    with pytest.raises(TypeError, match=r"^\[MultiHeadAttention\] unexpected keyword argument 'num_head'"):
        mha.MultiHeadAttention(8, num_head=2)
    with pytest.raises(TypeError, match=r"^\[OffsetPairTask.sample\] 3 positional arguments given"):
        mha.OffsetPairTask().sample(1, 2, 3)


@pytest.fixture(scope="module")
def int_walk(tmp_path_factory):
    return run_walk(tmp_path_factory.mktemp("int_walk"), ("--ints",))


# Integers valid where they are given: 64-bit unsigned seeds and byte counts,
# and widths of lazy modules and tasks that allocate nothing until used.
VALID_HUGE = {("seed", "2**31"), ("seed", "2**63"), ("bytes", "2**31"), ("bytes", "2**63"),
              ("num_hiddens", "2**31"), ("max_len", "2**31"), ("dims", "2**31")}


def test_every_integer_out_of_range_is_refused_naming_the_argument(int_walk):
    results, crashes = int_walk
    assert len(results) > 300, "the walk made too few calls to mean anything"
    assert not crashes, "crashed:\n" + "\n".join(crashes)
    problems = []
    for r in results:
        what = f"{r['label']}({r['arg']}={r['poison']})"
        if r["outcome"] == "accepted":
            if (r["arg"], r["poison"]) not in VALID_HUGE:
                problems.append(f"{what}: accepted")
        elif "ValueError" not in r["mro"] or "incompatible" in r["message"]:
            problems.append(f"{what}: {r['type']}: {r['message'][:200]}")
        elif not r["message"].startswith("[") or "_core" in r["message"] or "_torch_calls" in r["message"] \
                or not (r["arg"] in r["message"] or "memory limit" in r["message"] or "overflows 64 bits"
                        in r["message"] or "plot size" in r["message"]):
            problems.append(f"{what}: the message does not name the operation and {r['arg']}: {r['message'][:200]}")
    assert not problems, f"{len(problems)} of {len(results)} calls:\n" + "\n".join(problems[:80])


def test_an_integer_past_64_bits_names_the_range():
    cache = mha.MultiHeadAttention(8, 2).eval().kv_cache(1, 4)
    with pytest.raises(ValueError, match=r"^\[KVCache.truncate\] length: 18446744073709551616 is out of range; "
                                         r"wanted an integer in \[-9223372036854775808, 9223372036854775807\]"):
        cache.truncate(0, 2**64)
    with pytest.raises(ValueError, match=r"^\[set_memory_limit\] bytes: -1 is out of range; wanted an integer in "
                                         r"\[0, 18446744073709551615\]"):
        mha.set_memory_limit(-1)
    with pytest.raises(ValueError, match=r"^\[set_num_threads\] n: 2147483648 is not a thread count in \[1, "):
        mha.set_num_threads(2**31)
    with pytest.raises(ValueError, match=r"^\[MultiHeadAttention\] seed: 1000000000000000000000 is out of range"):
        mha.MultiHeadAttention(8, 2, seed=10**21)


def test_a_keyword_of_another_overload_is_checked_not_called_unexpected():
    # `cache` is a keyword of the cached call (the second overload): a value
    # of the wrong kind is named as such, not as an unexpected keyword.
    m = mha.MultiHeadAttention(8, 2).eval()
    x = np.ones((1, 1, 8), np.float32)
    with pytest.raises(mha.ArgumentTypeError,
                       match=r"^\[MultiHeadAttention.forward\] cache: got str, wanted mha.KVCache$"):
        m(x, x, x, cache="c")
    with pytest.raises(TypeError, match=r"^\[MultiHeadAttention.forward\] unexpected keyword argument 'cach'"):
        m(x, x, x, cach=m.kv_cache(1, 2))
