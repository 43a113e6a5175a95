// src/dist/mpi_error.h: an MPI return code turned into mha::Error.
//
// mha's communicators return MPI errors to the caller (MPI_ERRORS_RETURN)
// instead of aborting every process, so that a failure surfaces as the
// library's one exception type, naming the operation and the MPI call.
#pragma once

#include <mpi.h>

#include <string>

#include "mha/error.h"

namespace mha::dist {

// Throws mha::Error "[op] <call> failed<detail>: <MPI's text>" unless rc is
// MPI_SUCCESS.
inline void check_mpi(int rc, const char* op, const char* call, const std::string& detail = "") {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  fail(op, call, " failed", detail, ": ", len > 0 ? std::string(text, static_cast<size_t>(len)) : "MPI error " + std::to_string(rc));
}

}  // namespace mha::dist
