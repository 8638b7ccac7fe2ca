//===- StatusMacros.h - early returns on absl::Status -----------*- C++ -*-===//
#ifndef DUCK_RUNTIME_STATUSMACROS_H
#define DUCK_RUNTIME_STATUSMACROS_H

#include "absl/status/status.h"

#include <utility>

/// Returns the status of `expr` if it is an error.
#define DUCK_RETURN_IF_ERROR(expr)                                             \
  do {                                                                         \
    if (absl::Status _duck_s = (expr); !_duck_s.ok())                          \
      return _duck_s;                                                          \
  } while (0)

/// Assigns the value of a StatusOr expression or returns its error.
#define DUCK_ASSIGN_OR_RETURN(lhs, expr)                                       \
  DUCK_ASSIGN_OR_RETURN_IMPL(DUCK_CONCAT(_duck_or_, __LINE__), lhs, expr)
#define DUCK_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)                             \
  auto tmp = (expr);                                                           \
  if (!tmp.ok())                                                               \
    return tmp.status();                                                       \
  lhs = std::move(*tmp)
#define DUCK_CONCAT(a, b) DUCK_CONCAT_IMPL(a, b)
#define DUCK_CONCAT_IMPL(a, b) a##b

#endif
