// mha/mha.h: everything a user of the library needs, in one include.
//
//   #include <mha/mha.h>
//   mha::MultiHeadAttention attention(100, 5, 0.5f);
//   mha::Tensor X({2, 4, 100}, 1.0f), Y({2, 6, 100}, 1.0f);
//   mha::Tensor out = attention(X, Y, Y, mha::ValidLens::per_batch({3, 2}));
#pragma once

#include "mha/attention.h"
#include "mha/checkpoint.h"
#include "mha/error.h"
#include "mha/functional.h"
#include "mha/importance.h"
#include "mha/inspect.h"
#include "mha/kv_cache.h"
#include "mha/linear.h"
#include "mha/masks.h"
#include "mha/precision.h"
#include "mha/rotary.h"
#include "mha/loss.h"
#include "mha/model.h"
#include "mha/memory.h"
#include "mha/multihead.h"
#include "mha/optim.h"
#include "mha/parameter.h"
#include "mha/prune.h"
#include "mha/prune_experiment.h"
#include "mha/random.h"
#include "mha/safetensors.h"
#include "mha/task.h"
#include "mha/tensor.h"
#include "mha/threads.h"
#include "mha/torch_mha.h"
#include "mha/trainer.h"
#include "mha/valid_lens.h"
#include "mha/version.h"
