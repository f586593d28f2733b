// What every op's parameter struct shares: element type checks and the
// failure path for a struct that does not describe a valid launch.
#pragma once

#include "common/dtype.h"
#include "common/error.h"

// Each op's validate() uses this; a failure names the op and the field.
#define LS_OP_REQUIRE(cond, op, ...)                                                     \
  LS_REQUIRE(cond, ::lockstep::ErrorKind::kInternal, "{}: {}", op, fmt::format(__VA_ARGS__))
