// Force-included into every mlx-c translation unit. mlx-c's private/io.h
// uses std::format; GCC 12's libstdc++ has no <format>. Where the header is
// missing, map std::format to {fmt} (header-only, Debian libfmt-dev).
#pragma once
#if defined(__cplusplus)
#if __has_include(<format>)
#include <format>
#else
#define FMT_HEADER_ONLY
#include <fmt/format.h>
namespace std {
using fmt::format;
}
#endif
#endif
