// Error propagation helpers. Debian's abseil (20220623) has no
// ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN, so we define our own two.
#ifndef MOECACHE_COMMON_STATUS_MACROS_H_
#define MOECACHE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MOE_STATUS_CONCAT_INNER_(a, b) a##b
#define MOE_STATUS_CONCAT_(a, b) MOE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status moe_status_ = (expr);                 \
    if (!moe_status_.ok()) return moe_status_;           \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when not OK,
// else move-assigns the value to `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  MOE_ASSIGN_OR_RETURN_IMPL_(MOE_STATUS_CONCAT_(moe_statusor_, __LINE__), lhs, rexpr)

#define MOE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

#endif  // MOECACHE_COMMON_STATUS_MACROS_H_
