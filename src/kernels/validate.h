// src/kernels/validate.h: whether a kernel parameter struct is consistent.
//
// Modules check their users' inputs (and throw mha::Error); the kernels then
// trust the struct the module filled. These checks catch a module that
// filled it wrong: kernels::attention_forward / attention_backward /
// attention_weights (kernels/dispatch.h) run them on every call, in every
// build, and throw mha::Error on the first problem, so no kernel sees an
// inconsistent struct. (The decode kernel's check_decode_params is the
// same for DecodeParams.)
//
// Checked: every view's innermost stride is 1 and its rank is 4; q, k, v,
// out, grad_out and the gradients agree on B, h, hkv, Q, K, d and dv; Hkv
// divides H; the lengths pointer is set iff length_kind != None; the two
// statistics pointers are both set or both null; the scale divisor is
// positive; dropout p is in [0, 1]; the softcap is finite and >= 0, ALiBi
// slopes and sinks finite; a backward with sinks has grad_sinks.
#pragma once

#include <string>

#include "kernels/params.h"

namespace mha::kernels {

// The first problem found, in words; empty when the struct is consistent.
std::string validate(const AttentionForward& p);
std::string validate(const AttentionBackward& p);
std::string validate(const AttentionWeightsParams& p);

// Throws mha::Error naming `op`, the argument, the value seen and the value
// wanted, for any shape, stride, pointer or length the kernels cannot take.
void check_decode_params(const DecodeParams& p, const char* op);

}  // namespace mha::kernels
