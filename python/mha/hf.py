"""mha as an attention backend of Hugging Face transformers.

    import mha.hf                                    # registers attn_implementation="mha"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="mha")
    model.set_attn_implementation("mha")             # or switch a built model

Importing this module registers `attention_forward` under the name "mha" with
transformers' AttentionInterface, and transformers' own SDPA mask builder
(masking_utils.sdpa_mask) for it with AttentionMaskInterface, so a model
builds the same masks as with attn_implementation="sdpa" (boolean, True = the
key takes part; none when a plain causal mask suffices) and mha computes the
attention: grouped heads, causal, padding and sliding-window masks, Gemma 2's
logit softcapping, gpt-oss's attention sinks (s_aux, with their gradient),
dropout in training. Weights are not returned (output_attentions gives None,
as with "sdpa").
"""
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .torch_sdpa import attend

NAME = "mha"
OP = "mha.hf.attention_forward"

__all__ = ["NAME", "attention_forward", "register"]


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      softcap=None, s_aux=None, **kwargs):
    """transformers' attention function signature: query (B, H, L, d), key and value (B, Hkv, S, d),
    attention_mask None or (B or 1, H or 1, L, S') boolean (True = takes part) or additive, S' >= S
    -> ((B, L, H, d) output, None)."""
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError(f"[{OP}] position_bias: a learned position bias (T5-style) is not taken by "
                                  "mha's backend; use attn_implementation='sdpa' or 'eager' for this model")
    L, S = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' "sdpa": causal (top left) only when no mask was built and more than one query.
    causal = bool(causal) and attention_mask is None and L > 1
    if attention_mask is not None and attention_mask.shape[-1] > S:
        attention_mask = attention_mask[..., :S]
    out = attend(query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=causal, scale=scaling,
                 enable_gqa=key.shape[1] != query.shape[1], softcap=softcap, sinks=s_aux, op=OP)
    return out.transpose(1, 2).contiguous(), None


def register(name=NAME):
    """Registers attention_forward (and transformers' SDPA masks) as attn_implementation=name."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


register()
