# cmake/layers.cmake: mha's layers, lowest first, and what each one holds.
# Read by the top CMakeLists.txt (one library per layer) and by
# cmake/check_layers.cmake (the build-time check that includes only point down
# a layer or stay in it). docs/architecture.md ("## Layers") explains them.
#
# A layer may include headers of its own layer and of the layers before it in
# MHA_LAYERS, never of a layer after it.
# dist (multi-process attention over MPI) is last: it is optional (built only
# with MHA_BUILD_DIST, i.e. when MPI is found), so no other layer may use it.
set(MHA_LAYERS core kernels cpu nn train plot dist)

# Source folders of each layer, relative to the repository root. A folder's
# sources are globbed (every .cpp below it), so a file added to or removed
# from src/nn or src/kernels needs no edit here.
set(MHA_LAYER_DIRS_core    src/core src/io)
# kernels: the one interface (kernels/params.h), its validation and the
# mask and length vocabulary; cpu: the kernels that implement it (reference,
# BLAS, fused, decode, the GEMM) and the dispatch that picks one
# (src/cpu/dispatch.cpp defines kernels/dispatch.h). kernels/ never includes
# cpu/.
set(MHA_LAYER_DIRS_kernels src/kernels)
set(MHA_LAYER_DIRS_cpu     src/cpu)
# src/inspect (head_offsets.cpp) needs only tensors and ValidLens: nn.
set(MHA_LAYER_DIRS_nn      src/nn src/inspect)
set(MHA_LAYER_DIRS_train   src/train)
set(MHA_LAYER_DIRS_plot    src/plot)
set(MHA_LAYER_DIRS_dist    src/dist)

# The public headers (include/mha/, as included: "mha/<name>") by the layer
# that may first use them. A header declares vocabulary for its layer and
# those above; its layer is the lowest one whose code includes it.
# attention.h (AttentionKernel), masks.h (the mask enums) and valid_lens.h
# (ValidLens) are the vocabulary the kernels are called with, so they sit in
# the kernels layer, and so do their out-of-line parts (src/kernels/masks.cpp,
# src/kernels/valid_lens.cpp).
# A new public header must be added to one of these lists: the check fails
# on an include of a public header that is in none.
set(MHA_LAYER_HEADERS_core
  atomic_file.h
  detail/published.h
  error.h
  memory.h
  random.h
  safetensors.h
  tensor.h
  threads.h
  version.h
)
set(MHA_LAYER_HEADERS_kernels
  attention.h
  kernel.h
  masks.h
  precision.h
  valid_lens.h
)
set(MHA_LAYER_HEADERS_cpu
)
set(MHA_LAYER_HEADERS_nn
  context.h
  detail/head_layout.h
  detail/instance_id.h
  functional.h
  inspect.h
  kv_cache.h
  linear.h
  multihead.h
  parameter.h
  rotary.h
  torch_mha.h
)
set(MHA_LAYER_HEADERS_train
  checkpoint.h
  importance.h
  loss.h
  mha.h
  model.h
  optim.h
  prune.h
  prune_experiment.h
  task.h
  trainer.h
)
set(MHA_LAYER_HEADERS_plot
  plot.h
)
set(MHA_LAYER_HEADERS_dist
  dist.h
  dist/communicator.h
  dist/environment.h
  dist/grid_attention.h
  dist/head_parallel.h
  dist/ring_attention.h
)
