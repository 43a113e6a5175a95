"""Head gates, head pruning and head importance (issue 6).

The peer is the seed's PyTorch module (and the model twin of test_model.py)
with a gate per head: a forward pre-hook on W_o multiplies head h's columns
of its input by g_h, a tensor autograd differentiates. Tolerances:
gradients within 1e-5 of their tensor's scale against the float64 twin (as
test_backward.py, a bias's scale at least its weight's); a pruned module equals the gated one within 1e-6 of the
output's scale (+1e-6), the rounding of products over fewer terms.
"""
import json
import re
import subprocess

import numpy as np
import pytest
import torch

import mha
from test_model import TorchTwin, build
from test_viz_cli import check_picture
from training_helpers import normalised_error, random_case, seed_module_like


def gate(module, gates, dtype):
    """Gates on a seed module: returns the gate tensor autograd fills."""
    g = torch.tensor(np.asarray(gates, np.float64), dtype=dtype, requires_grad=True)
    d = module.W_o.weight.shape[1] // len(gates)
    module.W_o.register_forward_pre_hook(lambda mod, inp: (inp[0] * g.repeat_interleave(d),))
    return g


def close_to_rounding(got, want):
    scale = np.abs(want).max()
    return np.abs(got - want).max() <= 1e-6 * scale + 1e-6


# --- the module -----------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_gate_gradients_match_autograd(seed):
    """head_gate_grad, and every other gradient, with gates anywhere (0 and negative too)."""
    rng = np.random.default_rng(100 + seed)
    case = random_case(rng, max_len=37)
    H = case["num_heads"]
    gates = rng.choice([1.0, 0.0, 0.5, -1.5, 2.0], size=H).astype(np.float32)
    m = mha.MultiHeadAttention(case["num_hiddens"], H, case["dropout"], case["bias"], seed=seed)
    m.head_gates = gates
    out = m(case["queries"], case["keys"], case["values"], case["valid_lens"])
    (dq, dk, dv), grads = m.backward(case["grad_output"])
    t = seed_module_like(m, case, mask=m.last_dropout_mask, dtype=torch.float64)
    g = gate(t, gates, torch.float64)
    inputs = [torch.tensor(case[n], dtype=torch.float64, requires_grad=True) for n in ("queries", "keys", "values")]
    lens = None if case["valid_lens"] is None else torch.from_numpy(case["valid_lens"])
    t_out = t(*inputs, lens)
    t_out.backward(torch.from_numpy(case["grad_output"]).double())
    assert normalised_error(out, t_out.detach().numpy()) <= 1e-5
    assert normalised_error(m.head_gate_grad, g.grad.numpy()) <= 1e-5, (m.head_gate_grad, g.grad)
    for got, x in zip((dq, dk, dv), inputs):
        assert normalised_error(got, x.grad.numpy()) <= 1e-5
    t_grads = {name: p.grad.numpy() for name, p in t.named_parameters()}
    for name, want in t_grads.items():
        # A bias's scale is at least its weight's: W_k.bias's exact gradient is 0.
        scale = np.abs(want).max()
        if name.endswith(".bias"):
            scale = max(scale, np.abs(t_grads[name.replace(".bias", ".weight")]).max())
        assert np.abs(grads[name] - want).max() <= 1e-5 * scale, name


@pytest.mark.parametrize("seed", range(8))
def test_pruned_module_equals_gated_module(seed):
    rng = np.random.default_rng(200 + seed)
    case = random_case(rng, max_len=37)
    H = case["num_heads"]
    if H == 1:
        H, case = 3, dict(case, num_hiddens=3 * case["num_hiddens"], num_heads=3)
    prune = sorted(rng.choice(H, size=int(rng.integers(1, H)), replace=False).tolist())
    args = (case["queries"], case["keys"], case["values"], case["valid_lens"])
    gated = mha.MultiHeadAttention(case["num_hiddens"], H, 0.0, case["bias"], seed=seed).eval()
    gated.head_gates = np.array([0.0 if h in prune else 1.0 for h in range(H)])
    want = gated(*args)
    pruned = mha.MultiHeadAttention(case["num_hiddens"], H, 0.0, case["bias"], seed=seed).eval()
    pruned.load_state_dict(gated.state_dict())
    pruned.prune_heads(prune)
    assert pruned.kept_heads == [h for h in range(H) if h not in prune]
    assert pruned.num_heads == H - len(prune) and pruned.original_num_heads == H
    assert pruned.inner_dim == pruned.num_heads * pruned.head_dim and pruned.num_hiddens == case["num_hiddens"]
    for kernel in (mha.Kernel.REFERENCE, mha.Kernel.BLAS, mha.Kernel.FUSED):
        pruned.kernel = kernel
        got = pruned(*args)
        assert close_to_rounding(got, want), np.abs(got - want).max()
        np.testing.assert_allclose(pruned.attention_weights, gated.attention_weights[:, pruned.kept_heads],
                                   rtol=0, atol=1e-6)


def test_gates_and_pruning_refuse_bad_input():
    m = mha.MultiHeadAttention(12, 4)
    assert m.head_gates.tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.set_head_gates\] gates: shape \(3,\) is not \(4,\), one per head"):
        m.head_gates = [1, 1, 1]
    with pytest.raises(ValueError, match=r"gates: shape \(2, 2\) is not \(4,\)"):
        m.head_gates = np.ones((2, 2))
    with pytest.raises(ValueError, match="entry 2 is inf"):
        m.head_gates = [1, 1, np.inf, 1]
    with pytest.raises(ValueError, match=r"\[MultiHeadAttention.prune_heads\] heads: removing all 4"):
        m.prune_heads([0, 1, 2, 3])
    with pytest.raises(ValueError, match="entry 0 is -1"):
        m.prune_heads([-1])
    m.prune_heads([3, 0])
    assert m.kept_heads == [1, 2] and m.head_gates.shape == (2,)
    with pytest.raises(ValueError, match="head 3, which was already pruned"):
        m.prune_heads([3])


def test_pruned_files_load_and_run_on_the_cli(tmp_path, mha_tool):
    rng = np.random.default_rng(7)
    m = mha.MultiHeadAttention(20, 5, bias=True, seed=3).eval()
    X, Y = rng.standard_normal((3, 4, 6)).astype(np.float32), rng.standard_normal((3, 7, 6)).astype(np.float32)
    lens = np.array([2, 7, 5], np.float32)
    full_out = m(X, Y, Y, lens)
    full_weights = m.attention_weights
    m.prune_heads([1, 3])
    want = m(X, Y, Y, lens)
    w, x, out = tmp_path / "pruned.safetensors", tmp_path / "x.safetensors", tmp_path / "out.safetensors"
    mha.save_attention(str(w), m)
    assert mha.safetensors_metadata(str(w)) == {"num_heads": "5", "heads_kept": "0,2,4"}
    assert mha.load_safetensors(str(w))["W_o.weight"].shape == (20, 12)
    back = mha.load_attention(str(w))
    assert back.kept_heads == [0, 2, 4]
    np.testing.assert_array_equal(back(X, Y, Y, lens), want)
    assert not np.allclose(want, full_out, atol=1e-3)

    mha.save_safetensors(str(x), {"queries": X, "keys": Y, "values": Y, "valid_lens": lens})
    for heads in ([], ["--heads", "5"]):
        r = subprocess.run([mha_tool, "run", "--weights", str(w), "--inputs", str(x), "--out", str(out), *heads],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = mha.load_safetensors(str(out))
        np.testing.assert_allclose(got["output"], want, rtol=1e-5, atol=1e-6)
        assert got["attention_weights"].shape == (3, 3, 4, 7)
        np.testing.assert_allclose(got["attention_weights"], full_weights[:, [0, 2, 4]], rtol=1e-5, atol=1e-6)
        assert mha.safetensors_metadata(str(out)) == {"num_heads": "3", "heads_kept": "0,2,4"}
    r = subprocess.run([mha_tool, "run", "--weights", str(w), "--inputs", str(x), "--out", str(out), "--heads", "3"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--heads: 3 differs from the 5 heads (as built)" in r.stderr

    # mha viz names heads as built: --show-heads 4,0 draws the pruned module's heads 4 and 0.
    png, lay = tmp_path / "v.png", tmp_path / "v.json"
    r = subprocess.run([mha_tool, "viz", "--weights", str(w), "--inputs", str(x), "--rows", "1,2",
                        "--show-heads", "4,0", "--out", str(png), "--layout-json", str(lay)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    check_picture(png, json.loads(lay.read_text()), full_weights, lens, rows=[1, 2], heads=[4, 0])
    r = subprocess.run([mha_tool, "viz", "--weights", str(w), "--inputs", str(x), "--show-heads", "1",
                        "--out", str(png)], capture_output=True, text=True)
    assert r.returncode != 0 and "--show-heads: head 1 was pruned from this module (heads kept: 0,2,4)" in r.stderr


# --- the model and the importance measures ------------------------------

MODEL_CONFIGS = [
    dict(num_hiddens=12, num_heads=4, num_layers=1, dropout=0.0, bias=False, positions="learned", lens="batch"),
    dict(num_hiddens=12, num_heads=3, num_layers=2, dropout=0.3, bias=True, positions="sinusoidal", lens="batch"),
]


def task_model(cfg, seed=0):
    task = mha.OffsetPairTask(vocab=4, near=1, far=3, min_len=5, max_len=9)
    pos = mha.Positions.LEARNED if cfg["positions"] == "learned" else mha.Positions.SINUSOIDAL
    model = mha.AttentionModel(task.input_vocab, task.num_classes, 9, cfg["num_hiddens"], cfg["num_heads"],
                               cfg["num_layers"], cfg["dropout"], cfg["bias"], pos, seed=seed)
    # A few steps of training, so the heads differ from their initialisation.
    opt = mha.optim.Adam(model, lr=1e-2)
    for step in range(5):
        b = task.sample(16, 50 + step)
        model.zero_grad()
        _, grad, _, _ = mha.cross_entropy(model(b["tokens"], b["valid_lens"]), b["targets"])
        model.backward(grad)
        opt.step()
    twin_cfg = dict(cfg, num_classes=task.num_classes, vocab_size=task.input_vocab, max_len=9)
    return task, model, twin_cfg


def gated_twin(model, cfg):
    twin = TorchTwin(model, cfg, torch.float64).eval()  # eval: no dropout, as the measures
    gates = [gate(layer, np.ones(cfg["num_heads"]), torch.float64) for layer in twin.layers]
    return twin, gates


def sequence_loss(twin, tokens, targets, n):
    logits = twin(torch.from_numpy(tokens[None, :n]).long(), torch.tensor([float(n)], dtype=torch.float64))
    return torch.nn.functional.cross_entropy(logits[0], torch.from_numpy(targets[:n]).long(), ignore_index=-100,
                                             reduction="sum")


@pytest.mark.parametrize("cfg", MODEL_CONFIGS)
def test_gradient_importance_matches_autograd_of_the_gated_twin(cfg):
    task, model, tcfg = task_model(cfg)
    batches = mha.held_out_set(task, 40, 3)
    got = mha.gradient_importance(model, batches)
    twin, gates = gated_twin(model, tcfg)
    raw = [np.zeros(cfg["num_heads"]) for _ in gates]
    n_seq = 0
    for b in batches:
        for tokens, targets, n in zip(b["tokens"], b["targets"], b["valid_lens"].astype(int)):
            scored = int((targets[:n] != -100).sum())
            for g in gates:
                g.grad = None
            (sequence_loss(twin, tokens, targets, n) / scored).backward()
            for l, g in enumerate(gates):
                raw[l] += np.abs(g.grad.numpy())
            n_seq += 1
    assert got["sequences"] == n_seq == 40
    for l in range(cfg["num_layers"]):
        want = raw[l] / n_seq
        assert normalised_error(got["raw"][l], want) <= 1e-5, (got["raw"][l], want)
        assert normalised_error(got["normalised"][l], want / np.linalg.norm(want)) <= 1e-5
    # The model's gradients are left at zero, its gates at 1.
    assert all((g == 0).all() for g in model.grads().values())
    assert all((model.layer(l).head_gates == 1).all() for l in range(cfg["num_layers"]))


@pytest.mark.parametrize("cfg", MODEL_CONFIGS)
def test_ablation_and_attention_statistics_match_the_twin(cfg):
    task, model, tcfg = task_model(cfg, seed=1)
    batches = mha.held_out_set(task, 30, 4)
    abl = mha.ablation_importance(model, batches)
    stats = mha.attention_statistics(model, batches)
    twin, gates = gated_twin(model, tcfg)

    def twin_eval():
        loss, correct, scored = 0.0, 0, 0
        with torch.no_grad():
            for b in batches:
                logits = twin(torch.from_numpy(b["tokens"]).long(), torch.from_numpy(b["valid_lens"]).double())
                t = torch.from_numpy(b["targets"]).long()
                keep = t != -100
                loss += torch.nn.functional.cross_entropy(logits[keep], t[keep], reduction="sum").item()
                correct += int((logits[keep].argmax(-1) == t[keep]).sum())
                scored += int(keep.sum())
        return loss / scored, correct / scored, scored

    base_loss, base_acc, scored = twin_eval()
    assert abs(abl["loss"] - base_loss) <= 1e-5 * base_loss
    for l, g in enumerate(gates):
        for h in range(cfg["num_heads"]):
            with torch.no_grad():
                g[h] = 0.0
            loss, acc, _ = twin_eval()
            with torch.no_grad():
                g[h] = 1.0
            assert abs(abl["loss_increase"][l][h] - (loss - base_loss)) <= 1e-5 * base_loss
            # A near-tie may round the other way in float32: one position at most.
            assert abs(abl["accuracy_drop"][l][h] - (base_acc - acc)) <= 1.01 / scored

    # Voita et al.: over valid queries, the largest weight and the entropy.
    conf = [np.zeros(cfg["num_heads"]) for _ in gates]
    ent = [np.zeros(cfg["num_heads"]) for _ in gates]
    queries = 0
    with torch.no_grad():
        for b in batches:
            twin(torch.from_numpy(b["tokens"]).long(), torch.from_numpy(b["valid_lens"]).double())
            B, T = b["tokens"].shape
            valid = np.arange(T)[None, :] < b["valid_lens"][:, None]  # (B, T)
            queries += int(valid.sum())
            for l, layer in enumerate(twin.layers):
                w = layer.attention.attention_weights.reshape(B, cfg["num_heads"], T, T).numpy()
                plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0)
                conf[l] += (w.max(-1) * valid[:, None, :]).sum((0, 2))
                ent[l] += (-plogp.sum(-1) * valid[:, None, :]).sum((0, 2))
    assert stats["queries"] == queries
    for l in range(cfg["num_layers"]):
        np.testing.assert_allclose(stats["confidence"][l], conf[l] / queries, rtol=1e-5)
        np.testing.assert_allclose(stats["entropy"][l], ent[l] / queries, rtol=1e-5)


def test_pruned_model_equals_gated_model():
    task, model, _ = task_model(MODEL_CONFIGS[1])
    b = task.sample(6, 9)
    model.eval()
    model.layer(0).head_gates = [1, 0, 1]
    model.layer(1).head_gates = [0, 0, 1]
    want = model(b["tokens"], b["valid_lens"])
    model.layer(0).head_gates = [1, 1, 1]
    model.layer(1).head_gates = [1, 1, 1]
    mha.prune_model_heads(model, [(0, 1), (1, 0), (1, 1)])
    assert [model.layer(l).kept_heads for l in range(2)] == [[0, 2], [2]]
    assert close_to_rounding(model(b["tokens"], b["valid_lens"]), want)
    with pytest.raises(ValueError, match=r"layer 1: .*removing all 1 remaining heads"):
        mha.prune_model_heads(model, [(0, 0), (1, 2)])
    assert model.layer(0).kept_heads == [0, 2]  # nothing changed


# --- the experiment: mha prune ---------------------------------------------

def test_mha_prune_importance_order_beats_random_orders(tmp_path, mha_tool):
    """A small model trained by mha prune itself: 8 heads where the task needs 2.

    Pruning by gradient importance must keep held-out accuracy higher than
    the mean of random orders over the first half of the heads; the margins
    are printed (pytest -s)."""
    png, csv, pruned = tmp_path / "p.png", tmp_path / "p.csv", tmp_path / "pruned.safetensors"
    r = subprocess.run([mha_tool, "prune", "--heads", "8", "--hiddens", "32", "--steps", "150",
                        "--importance-size", "64", "--random-orders", "4", "--latency-repeats", "3",
                        "--latency-batch", "16", "--plot", str(png), "--csv", str(csv), "--pruned-out", str(pruned)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    print(out)
    area = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\w+) +([\d.]+)%", out, re.M)}
    assert set(area) == {"gradient", "ablation", "confidence", "entropy", "random"}, out
    assert area["gradient"] > area["random"], out
    assert area["ablation"] > area["random"], out
    best = re.search(r"best predictor: (\w+), ([\d.]+)% vs random orders' ([\d.]+)% \(([+-][\d.]+) points\)", out)
    assert best and best.group(1) in area and float(best.group(2)) == max(
        area[k] for k in ("gradient", "ablation", "confidence", "entropy"))
    assert re.search(r"forward latency \(batch 16 x \d+, median of 3\): 8 heads [\d.]+ ms, 4 heads [\d.]+ ms "
                     r"\([\d.]+x\), 1 heads [\d.]+ ms", out), out

    # The table: 8 heads, one layer keeping one: removals 0..7, each row's
    # accuracy within [0, 100] and the same start for every order.
    rows = re.findall(r"^ +(\d) +(\d) +([\d. ]+?) +[\d.]+ \( *[\d.]+\.\. *[\d.]+\) +([\d.]+)$", out, re.M)
    assert [int(k) for _, k, _, _ in rows] == list(range(8, 0, -1)), out
    first = [float(v) for v in rows[0][2].split()]
    assert len(first) == 8 and len(set(first)) == 1

    lines = csv.read_text().splitlines()
    assert lines[0] == "order,heads_removed,heads_kept,removed_layer,removed_head,accuracy,loss,latency_ms"
    assert len(lines) == 1 + (8 + 4) * 8
    img = mha.read_png(str(png))
    assert img.shape[2] == 4
    # Every measure's line shows, in its own colour (matplotlib's tab10, as
    # mha::plot::kPalette): gradient and ablation often give one order, and
    # identical curves drawn on top of each other would hide the first.
    palette = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    for name, rgb in zip(("gradient", "ablation", "confidence", "entropy"), palette):
        shown = int((img[:, :, :3] == np.array(rgb, np.uint8)).all(axis=2).sum())
        assert shown >= 40, f"{name}'s line is hidden: {shown} pixels of its colour"

    # --pruned-out: the model pruned to half by the best measure, readable.
    model, task, meta = mha.load_checkpoint(str(pruned))
    assert model.layer(0).num_heads == 4 and meta["layers.0.num_heads"] == "8"
    assert meta["layers.0.heads_kept"] == ",".join(map(str, model.layer(0).kept_heads))
    said = float(re.search(r"held-out accuracy ([\d.]+)%\n", out.split("wrote " + str(pruned))[1]).group(1))
    correct = scored = 0
    for b in mha.held_out_set(task, int(meta["train.eval_size"]), int(meta["train.held_out_seed"])):
        logits = model(b["tokens"], b["valid_lens"])
        keep = b["targets"] != -100
        correct += int((logits.argmax(-1)[keep] == b["targets"][keep]).sum())
        scored += int(keep.sum())
    assert abs(100 * correct / scored - said) <= 0.005


def test_mha_prune_refuses_what_it_cannot_do(tmp_path, mha_tool):
    ck = tmp_path / "two.safetensors"
    r = subprocess.run([mha_tool, "train", "--heads", "1", "--hiddens", "8", "--steps", "1", "--out", str(ck),
                        "--curves", "", "--plot", ""], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([mha_tool, "prune", "--checkpoint", str(ck)], capture_output=True, text=True)
    assert r.returncode != 0 and "nothing to prune" in r.stderr
    r = subprocess.run([mha_tool, "prune", "--checkpoint", str(ck), "--heads", "4"], capture_output=True, text=True)
    assert r.returncode != 0 and "--heads: only for training without --checkpoint" in r.stderr
