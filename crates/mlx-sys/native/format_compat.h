// Force-included into every mlx-c translation unit. GCC 12's libstdc++ has
// no <format>; mlx-c's private/io.h uses std::format. Map it to {fmt}
// (header-only) where the standard library lacks it.
#pragma once
#if defined(__cplusplus)
#include <version>
#if !defined(__cpp_lib_format)
#define FMT_HEADER_ONLY
#include <fmt/format.h>
namespace std {
using fmt::format;
}
#endif
#endif
