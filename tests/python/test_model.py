"""AttentionModel, its loss and its gradients against a PyTorch twin.

The twin is the model written in PyTorch from the seed's MultiHeadAttention
(tests/python/seed_reference.py), nn.functional.cross_entropy and d2l's
positional encoding, loaded with our parameters and fed our dropout masks.
Tolerances as for the module (test_backward.py): every gradient within 1e-5
of its tensor's scale against the twin in float32 and in float64, and
central finite differences (float64 twin, h = 1e-6) within
1e-5 * scale + 1e-4 * |fd|.
"""
import numpy as np
import pytest
import torch

import mha
import seed_reference as seed
from training_helpers import FixedDropout, normalised_error


def d2l_positional_encoding(max_len, num_hiddens):
    """d2l's PositionalEncoding table, from its code."""
    P = torch.zeros((1, max_len, num_hiddens))
    X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
        10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
    P[:, :, 0::2] = torch.sin(X)
    P[:, :, 1::2] = torch.cos(X)
    return P[0]


class TorchTwin(torch.nn.Module):
    def __init__(self, model, cfg, dtype):
        super().__init__()
        state = {n: torch.from_numpy(a).to(dtype) for n, a in model.state_dict().items()}
        self.embedding = torch.nn.Parameter(state["embedding.weight"])
        if "positions.weight" in state:
            self.positions = torch.nn.Parameter(state["positions.weight"])
        else:
            self.register_buffer("positions", torch.from_numpy(model.positions).to(dtype))
        D, h = cfg["num_hiddens"], cfg["num_heads"]
        self.layers = torch.nn.ModuleList()
        for i in range(cfg["num_layers"]):
            layer = seed.make_seed_module(D, h, D, D, D, cfg["bias"], dropout=cfg["dropout"])
            prefix = f"layers.{i}."
            layer.load_state_dict({n[len(prefix):]: t for n, t in state.items() if n.startswith(prefix)})
            self.layers.append(layer.to(dtype))
        self.readout = torch.nn.Linear(D, cfg["num_classes"]).to(dtype)
        self.readout.load_state_dict({"weight": state["readout.weight"], "bias": state["readout.bias"]})

    def set_masks(self, model):
        for i, layer in enumerate(self.layers):
            mask = model.layer(i).last_dropout_mask
            B, h, Q, K = mask.shape
            layer.attention.dropout = FixedDropout(
                torch.from_numpy(mask).reshape(B * h, Q, K).to(self.embedding.dtype))

    def forward(self, tokens, lens):
        X = self.embedding[tokens] + self.positions[: tokens.shape[1]]
        for layer in self.layers:
            Y = layer(X, X, X, lens)
            X = X + Y if len(self.layers) > 1 else Y
        return self.readout(X)

    def named_grads(self):
        out = {"embedding.weight": self.embedding.grad}
        if isinstance(self.positions, torch.nn.Parameter):
            out["positions.weight"] = self.positions.grad
        for i, layer in enumerate(self.layers):
            for n, p in layer.named_parameters():
                out[f"layers.{i}.{n}"] = p.grad
        out["readout.weight"] = self.readout.weight.grad
        out["readout.bias"] = self.readout.bias.grad
        return {n: g.detach().numpy() for n, g in out.items()}


CONFIGS = [
    dict(num_hiddens=8, num_heads=2, num_layers=1, dropout=0.0, bias=False, positions="learned", lens="batch"),
    dict(num_hiddens=12, num_heads=3, num_layers=2, dropout=0.3, bias=True, positions="sinusoidal", lens="batch"),
    dict(num_hiddens=10, num_heads=5, num_layers=3, dropout=0.0, bias=True, positions="learned", lens="query"),
    dict(num_hiddens=6, num_heads=1, num_layers=2, dropout=0.5, bias=False, positions="learned", lens="none"),
]


def build(cfg, rng, B=3, vocab=7, max_len=9):
    cfg = dict(cfg, num_classes=5, vocab_size=vocab, max_len=max_len)
    pos = mha.Positions.LEARNED if cfg["positions"] == "learned" else mha.Positions.SINUSOIDAL
    model = mha.AttentionModel(vocab, cfg["num_classes"], max_len, cfg["num_hiddens"], cfg["num_heads"],
                               cfg["num_layers"], cfg["dropout"], cfg["bias"], pos, seed=11)
    T = max_len - 1
    tokens = rng.integers(0, vocab, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, cfg["num_classes"], size=(B, T)).astype(np.int32)
    targets[rng.random((B, T)) < 0.3] = -100
    lens = {"none": None,
            "batch": np.array([T, 3, 5.5][:B], np.float32),
            "query": rng.integers(1, 2 * T, size=(B, T)).astype(np.float32) / 2}[cfg["lens"]]
    return cfg, model, tokens, targets, lens


def twin_loss(twin, tokens, targets, lens, dtype):
    logits = twin(torch.from_numpy(tokens).long(), None if lens is None else torch.from_numpy(lens))
    C = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, C), torch.from_numpy(targets).long().reshape(-1),
                                             ignore_index=-100)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_model_gradients_match_the_pytorch_twin(cfg):
    rng = np.random.default_rng(len(str(cfg)))
    cfg, model, tokens, targets, lens = build(cfg, rng)
    logits = model(tokens, lens)
    loss, grad, _, _ = mha.cross_entropy(logits, targets)
    grads = model.backward(grad)
    for dtype in (torch.float32, torch.float64):
        twin = TorchTwin(model, cfg, dtype)
        twin.set_masks(model)
        t_loss = twin_loss(twin, tokens, targets, lens, dtype)
        t_loss.backward()
        assert abs(loss - t_loss.item()) <= 1e-5 * abs(t_loss.item())
        t_grads = twin.named_grads()
        assert sorted(grads) == sorted(t_grads)
        for name, g in t_grads.items():
            scale = np.abs(g).max()
            if name.endswith(".bias"):
                scale = max(scale, np.abs(t_grads[name.replace(".bias", ".weight")]).max())
            err = np.abs(grads[name] - g).max()
            assert err <= 1e-5 * scale, (dtype, name, err, scale)


def test_model_gradients_match_finite_differences():
    cfg = dict(num_hiddens=4, num_heads=2, num_layers=2, dropout=0.4, bias=True, positions="learned", lens="query")
    rng = np.random.default_rng(5)
    cfg, model, tokens, targets, lens = build(cfg, rng, B=2, vocab=4, max_len=5)
    logits = model(tokens, lens)
    _, grad, _, _ = mha.cross_entropy(logits, targets)
    grads = model.backward(grad)
    twin = TorchTwin(model, cfg, torch.float64)
    twin.set_masks(model)
    params = dict(twin.named_parameters())
    names = {"embedding": "embedding.weight", "positions": "positions.weight",
             "readout.weight": "readout.weight", "readout.bias": "readout.bias"}
    h = 1e-6
    with torch.no_grad():
        for tname, p in params.items():
            name = names.get(tname, tname)
            fd = np.zeros(p.shape)
            flat = p.data.view(-1)
            for i in range(flat.numel()):
                old = flat[i].item()
                flat[i] = old + h
                up = twin_loss(twin, tokens, targets, lens, torch.float64).item()
                flat[i] = old - h
                down = twin_loss(twin, tokens, targets, lens, torch.float64).item()
                flat[i] = old
                fd.reshape(-1)[i] = (up - down) / (2 * h)
            scale = np.abs(fd).max()
            if name.endswith(".bias"):
                scale = max(scale, np.abs(grads[name.replace(".bias", ".weight")]).max())
            bound = 1e-5 * scale + 1e-4 * np.abs(fd)
            assert (np.abs(grads[name] - fd) <= bound).all(), (name, np.abs(grads[name] - fd).max(), scale)


def test_sinusoidal_positions_are_d2ls():
    model = mha.AttentionModel(5, 3, 40, num_hiddens=12, num_heads=2, positions=mha.Positions.SINUSOIDAL)
    np.testing.assert_allclose(model.positions, d2l_positional_encoding(40, 12).numpy(), rtol=0, atol=1e-5)
    assert "positions.weight" not in model.state_dict()


def test_cross_entropy_matches_torch():
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((4, 6, 11)) * 3).astype(np.float32)
    targets = rng.integers(0, 11, size=(4, 6)).astype(np.int32)
    targets[0, :3] = -100
    loss, grad, correct, scored = mha.cross_entropy(logits, targets)
    t_logits = torch.tensor(logits.reshape(-1, 11), requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.from_numpy(targets).long().reshape(-1))
    t_loss.backward()
    assert abs(loss - t_loss.item()) <= 1e-6 * t_loss.item()
    assert normalised_error(grad.reshape(-1, 11), t_logits.grad.numpy()) <= 1e-6
    assert scored == 21
    assert correct == int((logits.argmax(-1) == targets).sum())


def test_model_errors_name_the_problem():
    model = mha.AttentionModel(5, 3, 8, num_hiddens=4, num_heads=2)
    with pytest.raises(ValueError, match=r"\[AttentionModel.forward\] tokens: entry 1 is 5, not an id in \[0, 5\)"):
        model(np.array([[0, 5]]))
    with pytest.raises(ValueError, match=r"tokens: length 9 \(shape \(1, 9\)\) exceeds max_len 8"):
        model(np.zeros((1, 9)))
    with pytest.raises(ValueError, match=r"\[AttentionModel.backward\] grad_logits: shape \(1, 2, 4\)"):
        model(np.zeros((1, 2)))
        model.backward(np.zeros((1, 2, 4), np.float32))
    with pytest.raises(ValueError, match=r"\[AttentionModel\] num_layers: 0 is not positive"):
        mha.AttentionModel(5, 3, 8, num_layers=0)
    with pytest.raises(ValueError, match=r"\[OffsetPairTask\] far: 1 is not greater than near 1"):
        mha.OffsetPairTask(near=1, far=1)
    with pytest.raises(ValueError, match=r"\[cross_entropy\] targets: entry 0 is 7"):
        mha.cross_entropy(np.zeros((1, 3), np.float32), np.array([7]))


def test_training_from_python_with_mha_optim():
    """The model, its loss and an optimiser, driven from Python, learn the task."""
    task = mha.OffsetPairTask()
    model = mha.AttentionModel(task.input_vocab, task.num_classes, task.config["max_len"], seed=0)
    opt = mha.optim.Adam(model, lr=3e-3)
    losses = []
    for step in range(60):
        b = task.sample(32, step)
        model.zero_grad()
        loss, grad, _, _ = mha.cross_entropy(model(b["tokens"], b["valid_lens"]), b["targets"])
        model.backward(grad)
        mha.optim.clip_grad_norm(model, 1.0)
        opt.step()
        losses.append(loss)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    assert opt.steps == 60 and "readout.weight.exp_avg" in opt.state()
