"""Every bound function and property refuses values that are not numbers.

The walk calls each public callable of the mha module (functions, classes,
methods, property setters) with strings, bytes, objects, None, ragged nested
lists, dicts of such values, complex numbers, dates, byte-string and
structured arrays, in every argument position after valid leading
arguments. Each call must raise TypeError or ValueError (or, for None, may
succeed where None is a documented default): never crash the interpreter,
never raise anything else, never take such a value as a number. The walk runs
in a child process so that a segmentation fault fails the test with its
Python traceback (faulthandler) instead of killing pytest.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mha

WALK = textwrap.dedent(r'''
    import faulthandler, inspect, sys, tempfile, os
    import numpy as np
    import mha

    faulthandler.enable()
    tmp = tempfile.mkdtemp()
    ones = lambda *s: np.ones(s, np.float32)
    BAD = {
        "str": "abc", "bytes": b"\x00ab", "object": object(), "None": None, "ragged": [[1, 2], [3]],
        "dict": {"a": "one"}, "complex": 1 + 2j, "complex_array": np.array([1 + 2j]),
        "dates": np.array(["2020-01-01"], "datetime64[D]"), "durations": np.array([1], "timedelta64[s]"),
        "byte_strings": np.array([b"1.5"]), "strings": np.array(["1.5"]),
        "records": np.zeros(2, [("a", "f4"), ("b", "f4")]), "bad_values_dict": {"W_q.weight": "abc"},
        "none_values_dict": {"W_q.weight": None}, "int_keys_dict": {1: 2}, "objects_list": [object()],
        "object_array": np.array([1, None], dtype=object),
    }

    def called_mha():
        m = mha.MultiHeadAttention(8, 2)
        m(ones(2, 3, 4), ones(2, 3, 4), ones(2, 3, 4))
        return m

    def small_model():
        return mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2)

    def torch_state():
        return {"in_proj_weight": ones(12, 4), "in_proj_bias": ones(12), "out_proj.weight": ones(4, 4),
                "out_proj.bias": ones(4)}

    def tmha():
        return mha.TorchMultiheadAttention.from_state_dict(torch_state(), num_heads=2, batch_first=True)

    task = mha.OffsetPairTask(vocab=4, near=1, far=2, min_len=3, max_len=6)
    batch = task.sample(2, 0)
    q3 = ones(2, 3, 4)
    # Valid leading arguments of each callable, so that every position is reached.
    GOOD = {
        "masked_softmax": [ones(2, 3, 4)],
        "DotProductAttention": [0.0, 0],
        "DotProductAttention.__call__": [q3, q3, q3],
        "MultiHeadAttention": [8, 2, 0.0, False, 0],
        "MultiHeadAttention.__call__": [q3, q3, q3],
        "MultiHeadAttention.backward": [ones(2, 3, 8)],
        "MultiHeadAttention.attention_weights_of": [[0], [0]],
        "MultiHeadAttention.initialize": [4, 4, 4],
        "AttentionModel": [5, 3, 8, 4, 2, 1, 0.0, False, mha.Positions.LEARNED, 0],
        "AttentionModel.__call__": [np.zeros((2, 3), np.int64)],
        "AttentionModel.layer": [0],
        "OffsetPairTask": [4, 1, 2, 3, 6],
        "OffsetPairTask.sample": [2, 0],
        "cross_entropy": [ones(2, 3), np.zeros(2, np.int64)],
        "save_safetensors": [os.path.join(tmp, "a.safetensors"), {"x": ones(1)}],
        "save_attention": [os.path.join(tmp, "b.safetensors"), called_mha()],
        "load_attention": [os.path.join(tmp, "b.safetensors"), 2],
        "TorchMultiheadAttention.from_state_dict": [torch_state(), 2, True, None, None, False, None, 0.0,
                                                    mha.FullyMaskedRows.ZEROS, 0],
        "TorchMultiheadAttention.__call__": [ones(2, 3, 4), ones(2, 5, 4), ones(2, 5, 4)],
        "head_offsets": [ones(1, 2, 3, 3), None, 0],
        "held_out_set": [task, 4, 1],
        "gradient_importance": [small_model()],
        "ablation_importance": [small_model()],
        "attention_statistics": [small_model()],
        "prune_model_heads": [small_model()],
        "write_png": [os.path.join(tmp, "a.png")],
        "show_heatmaps": [ones(1, 1, 2, 2)],
        "optim.SGD": [called_mha(), 0.1],
        "optim.Adam": [called_mha()],
        "optim.AdamW": [called_mha()],
        "optim.clip_grad_norm": [called_mha(), 1.0],
    }
    mha.save_attention(os.path.join(tmp, "b.safetensors"), called_mha())
    INSTANCES = {
        "MultiHeadAttention": called_mha, "DotProductAttention": lambda: mha.DotProductAttention(),
        "AttentionModel": small_model, "OffsetPairTask": lambda: task,
        "TorchMultiheadAttention": tmha, "Mask": lambda: mha.Mask.keep(np.ones((2, 2), bool)),
    }
    SKIP = {"read_png", "load_safetensors", "safetensors_metadata", "load_checkpoint"}  # paths: str only
    problems, calls = [], 0

    def attempt(label, f, args, bad_name):
        global calls
        calls += 1
        try:
            f(*args)
        except (TypeError, ValueError):
            return
        except Exception as e:  # noqa: BLE001
            problems.append(f"{label} with {bad_name}: {type(e).__name__}: {e}")
            return
        if bad_name != "None":
            problems.append(f"{label} with {bad_name}: accepted")

    def walk(label, f, n_max=4):
        good = GOOD.get(label, [])
        for bad_name, bad in BAD.items():
            for n in range(1, n_max + 1):
                attempt(label, f, [bad] * n, bad_name)
            for i in range(len(good)):
                attempt(f"{label}[arg {i}]", f, good[:i] + [bad], bad_name)

    for name in sorted(dir(mha)):
        if name.startswith("_") or name in SKIP:
            continue
        obj = getattr(mha, name)
        if inspect.ismodule(obj):
            if name == "optim":
                for sub in ("SGD", "Adam", "AdamW", "clip_grad_norm"):
                    walk(f"optim.{sub}", getattr(mha.optim, sub))
            continue
        if isinstance(obj, type):
            if issubclass(obj, int) or name in ("Kernel", "Positions", "Causal", "FullyMaskedRows"):
                continue  # enums
            if issubclass(obj, BaseException):
                continue  # mha.ArgumentTypeError
            if name not in ("HeadOffsets",):
                walk(name, obj)
            make = INSTANCES.get(name)
            if make is None:
                continue
            for attr in sorted(dir(obj)):
                if attr.startswith("_") and attr != "__call__":
                    continue
                member = inspect.getattr_static(obj, attr)
                if isinstance(member, property):
                    if member.fset is not None:
                        walk(f"{name}.{attr} =", lambda v, attr=attr: setattr(make(), attr, v), 1)
                    continue
                if attr in ("train", "eval", "zero_grad", "state_dict", "grads"):
                    continue  # no numeric argument (train(mode): bool)
                walk(f"{name}.{attr}", lambda *a, attr=attr: getattr(make(), attr)(*a))
        elif callable(obj):
            walk(name, obj)

    print(f"{calls} calls")
    print("\n".join(problems))
    sys.exit(1 if problems else 0)
''')


def test_every_bound_function_refuses_values_that_are_not_numbers(tmp_path):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"


@pytest.mark.parametrize("bad", [np.array([1 + 2j] * 3, np.complex64).reshape(1, 1, 3),
                                 np.array(["2020-01-01"] * 3, "datetime64[D]").reshape(1, 1, 3),
                                 np.array([b"1"] * 3).reshape(1, 1, 3),
                                 np.zeros((1, 1, 3), [("a", "f4")])])
def test_arrays_of_non_real_dtypes_are_refused_by_name(bad):
    m = mha.MultiHeadAttention(4, 2)
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.forward\] queries: dtype .* is not a real number"):
        m(bad, np.ones((1, 2, 3), np.float32), np.ones((1, 2, 3), np.float32))


def test_integer_tokens_beyond_int32_and_fractional_tokens_are_refused():
    model = mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2)
    with pytest.raises(ValueError, match=r"tokens: entry 1 is 4294967297, outside the 32-bit integers"):
        model(np.array([[0, 2**32 + 1]], np.int64))
    with pytest.raises(ValueError, match=r"tokens: entry 0 is 1.5, not an integer"):
        model(np.array([[1.5, 2.0]]))
    model(np.array([[1.0, 2.0]]))  # integral floats are integers
    with pytest.raises(ValueError, match=r"\[cross_entropy\] targets: entry 0 is 4294967296"):
        mha.cross_entropy(np.ones((1, 3), np.float32), np.array([2**32], np.uint64))


def test_torch_tensors_that_require_grad_are_read_as_their_data():
    torch = pytest.importorskip("torch")
    q = torch.ones(2, 3, 4, requires_grad=True)
    m = mha.MultiHeadAttention(8, 2)
    out = m(q, q, q)
    np.testing.assert_array_equal(out, mha.MultiHeadAttention(8, 2)(*[np.ones((2, 3, 4), np.float32)] * 3))
    assert q.grad is None


def test_a_mistyped_keyword_is_named_without_the_inputs():
    torch = pytest.importorskip("torch")
    q = torch.ones(2, 300, 40)
    m = mha.MultiHeadAttention(8, 2)
    with pytest.raises(TypeError) as err:
        m(q, q, q, valid_len=np.array([3, 2]))
    assert "valid_len" in str(err.value)
    assert len(str(err.value)) < 400, str(err.value)


def test_attention_weights_before_any_call_is_an_error():
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.attention_weights\] no forward call yet"):
        mha.MultiHeadAttention(8, 2).attention_weights
    with pytest.raises(ValueError, match=r"\[DotProductAttention.attention_weights\] no forward call yet"):
        mha.DotProductAttention().attention_weights


def test_printing_a_module_shows_its_configuration():
    m = mha.MultiHeadAttention(12, 4, 0.1)
    assert repr(m) == "mha.MultiHeadAttention(num_hiddens=12, num_heads=4, dropout=0.1, bias=False)"
    m.prune_heads([1])
    assert repr(m).endswith("with heads [0, 2, 3] kept")
    m.precision = "bf16"
    assert repr(m) == ("mha.MultiHeadAttention(num_hiddens=12, num_heads=4, dropout=0.1, bias=False, "
                       "precision='bfloat16') with heads [0, 2, 3] kept")
    assert "num_layers=2" in repr(mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2, num_layers=2))
    t = mha.TorchMultiheadAttention.from_state_dict({"in_proj_weight": np.ones((12, 4)),
                                                     "out_proj.weight": np.ones((4, 4))}, num_heads=2)
    assert repr(t).startswith("mha.TorchMultiheadAttention(embed_dim=4, num_heads=2")


def test_zero_kdim_and_num_kv_heads_are_not_taken_as_not_given():
    state = {"in_proj_weight": np.ones((12, 4)), "out_proj.weight": np.ones((4, 4))}
    for name in ("kdim", "vdim", "num_kv_heads"):
        with pytest.raises(ValueError, match=f"{name}: 0 is not positive"):
            mha.TorchMultiheadAttention.from_state_dict(state, num_heads=2, **{name: 0})


def test_finite_inputs_never_give_a_silent_nan():
    with pytest.raises(ValueError, match="has no features"):
        mha.DotProductAttention()(np.ones((1, 2, 0)), np.ones((1, 3, 0)), np.ones((1, 3, 2)))
    big = np.full((1, 2, 4), 1e20, np.float32)
    module = mha.MultiHeadAttention(4, 2)
    module.load_state_dict({f"{n}.weight": np.ones((4, 4), np.float32) for n in ("W_q", "W_k", "W_v", "W_o")})
    for attention in (mha.DotProductAttention(), module):
        with pytest.raises(ValueError, match="overflow"):
            attention(big, big, big)
    # Inputs that are NaN are computed through, as PyTorch does.
    nan = np.full((1, 2, 4), np.nan, np.float32)
    assert np.isnan(mha.MultiHeadAttention(4, 2)(nan, nan, nan)).all()


def test_paths_with_a_nul_byte_are_refused(tmp_path):
    with pytest.raises(ValueError, match="contains a NUL byte"):
        mha.save_safetensors(str(tmp_path / "a\0b.safetensors"), {"x": np.ones(1)})
    assert list(tmp_path.iterdir()) == []


def test_real_number_arguments_take_numpy_and_torch_scalars_only():
    torch = pytest.importorskip("torch")
    assert mha.MultiHeadAttention(8, 2, dropout=np.float32(0.25)).dropout == 0.25
    assert mha.MultiHeadAttention(8, 2, dropout=torch.tensor(0.5)).dropout == 0.5
    for bad in (np.array(["0.5"]), np.array([0.5, 0.5]), 0.5 + 0j, "0.5"):
        with pytest.raises(TypeError):
            mha.MultiHeadAttention(8, 2, dropout=bad)
    with pytest.raises(TypeError):
        mha.MultiHeadAttention(8, 2, bias=np.array([1.0]))  # booleans are True or False


def test_mistyped_keywords_of_calls_that_take_arrays_are_named_briefly(tmp_path):
    big = {"in_proj_weight": np.ones((300, 100), np.float32), "out_proj.weight": np.ones((100, 100), np.float32)}
    calls = [
        lambda: mha.TorchMultiheadAttention.from_state_dict(big, num_heads=2, batch_frist=True),
        lambda: mha.save_safetensors(str(tmp_path / "x.safetensors"), big, metdata={}),
        lambda: mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2).load_state_dict(state=big),
        lambda: mha.MultiHeadAttention(8, 2).set_grads(grad=big),
    ]
    for call in calls:
        with pytest.raises(TypeError) as err:
            call()
        assert "unexpected keyword argument" in str(err.value) and len(str(err.value)) < 400, str(err.value)
