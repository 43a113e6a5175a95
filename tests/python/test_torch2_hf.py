"""torch 2.x line only (transformers is installed there): mha as a Hugging Face attention backend
(python/mha/hf.py, attn_implementation="mha").

Models are built from small configs with random weights (nothing downloaded): a Llama decoder, a
grouped-query Qwen2, a Gemma 2 with logit softcapping and sliding windows, and a gpt-oss with attention
sinks. Each is compared with the same weights under transformers' own attention ("sdpa", or "eager"
where "sdpa" lacks the option: Gemma 2's softcap, gpt-oss's sinks): logits on a padded batch within
float32 tolerance (2e-5 of the largest logit), greedy generate() with transformers' cache giving the
same tokens, and one training step's gradients (2e-5 of the largest).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from mha import _torch_ops  # noqa: E402

if not _torch_ops.HAS_LIBRARY:
    pytest.skip("the Hugging Face backend is tested on the torch 2.x line", allow_module_level=True)

import mha.hf  # noqa: E402,F401  (registers attn_implementation="mha")

TOL = 2e-5
VOCAB = 97


def _llama():
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)


def _qwen2():
    return transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128)


def _gemma2():
    return transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=128, sliding_window=4, attn_logit_softcapping=5.0,
                                     final_logit_softcapping=30.0)


def _gpt_oss():
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss model (attention sinks)")
    return transformers.GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                                     max_position_embeddings=128, layer_types=["sliding_attention", "full_attention"])


MODELS = {"llama": (_llama, "sdpa"), "qwen2": (_qwen2, "sdpa"), "gemma2": (_gemma2, "eager"),
          "gpt_oss": (_gpt_oss, "eager")}


def _pair(kind):
    make, peer = MODELS[kind]
    config = make()
    torch.manual_seed(0)
    ours = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="mha",
                                                         dtype=torch.float32)
    if kind == "gpt_oss":  # the sinks start at zero: make them matter
        with torch.no_grad():
            for name, p in ours.named_parameters():
                if name.endswith("sinks"):
                    p.copy_(torch.linspace(-2.0, 2.0, p.numel()))
    theirs = copy.deepcopy(ours)
    theirs.set_attn_implementation(peer)
    assert ours.config._attn_implementation == "mha"
    return ours.eval(), theirs.eval()


def _batch(B=3, L=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0   # left padding, as generate() pads
    mask[B - 1, :L // 2] = 0
    return ids, mask


def _close(a, b, what):
    err = float((a - b).abs().max())
    assert err <= TOL * max(1.0, float(b.abs().max())), f"{what}: {err:.3g}"


@pytest.mark.parametrize("kind", list(MODELS))
def test_logits_match_transformers_attention(kind):
    ours, theirs = _pair(kind)
    ids, mask = _batch()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()  # a padded position's logits are whatever its fully masked row gives
    _close(a[keep], b[keep], f"{kind} logits")
    with torch.no_grad():  # without a mask: the causal mask may be left to is_causal
        _close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, f"{kind} logits without padding")


@pytest.mark.parametrize("kind", list(MODELS))
def test_generate_gives_the_same_tokens(kind):
    ours, theirs = _pair(kind)
    ids, mask = _batch(B=2, L=7, seed=1)
    args = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    a = ours.generate(input_ids=ids, attention_mask=mask, **args)
    b = theirs.generate(input_ids=ids, attention_mask=mask, **args)
    assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("kind", list(MODELS))
def test_training_step_gradients_match(kind):
    ours, theirs = _pair(kind)
    ids, mask = _batch(B=2, L=9, seed=2)
    grads = []
    for model in (ours, theirs):
        model.train()
        model.zero_grad()
        # Padded positions out of the loss, as inputs and as labels: their rows see no key, which each
        # backend fills its own way (the label of position t is read with the logits of t - 1).
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        _close(grads[0][name], grads[1][name], f"{kind} gradient of {name}")
    if kind == "gpt_oss":
        assert any(n.endswith("sinks") for n in grads[0]), "the sinks got no gradient"


def test_dropout_in_training_is_applied():
    config = _llama()
    config.attention_dropout = 0.5
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="mha").train()
    ids, _ = _batch(B=2, L=8)
    torch.manual_seed(3)
    a = model(input_ids=ids).logits
    torch.manual_seed(3)
    b = model(input_ids=ids).logits
    torch.manual_seed(4)
    c = model(input_ids=ids).logits
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_position_bias_is_refused_clearly():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match=r"mha\.hf\.attention_forward\] position_bias"):
        mha.hf.attention_forward(torch.nn.Module(), q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))
