// src/io/atomic_file.h: the library's own name for mha/atomic_file.h, which
// is public so that the `mha` tool writes its files the same way.
#pragma once

#include "mha/atomic_file.h"
