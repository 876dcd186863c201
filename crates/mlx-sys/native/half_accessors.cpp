// float16 / bfloat16 accessors that mlx-c compiles only on aarch64 (see
// half.h). mlx-rs needs them everywhere; on other targets they are written
// here against MLX's C++ API with 16-bit storage in and out.
#include <cstdint>
#include <cstring>

#include "mlx/c/error.h"
#include "mlx/c/half.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/mlx.h"

#if !defined(HAS_FLOAT16)
extern "C" int mlx_array_item_float16(uint16_t* res, const mlx_array arr) {
  try {
    auto v = mlx_array_get_(arr).item<mlx::core::float16_t>();
    std::memcpy(res, &v, sizeof(uint16_t));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
extern "C" const uint16_t* mlx_array_data_float16(const mlx_array arr) {
  try {
    return reinterpret_cast<const uint16_t*>(
        mlx_array_get_(arr).data<mlx::core::float16_t>());
  } catch (std::exception& e) {
    mlx_error(e.what());
    return nullptr;
  }
}
#endif

#if !defined(HAS_BFLOAT16)
extern "C" int mlx_array_item_bfloat16(uint16_t* res, const mlx_array arr) {
  try {
    auto v = mlx_array_get_(arr).item<mlx::core::bfloat16_t>();
    std::memcpy(res, &v, sizeof(uint16_t));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
extern "C" const uint16_t* mlx_array_data_bfloat16(const mlx_array arr) {
  try {
    return reinterpret_cast<const uint16_t*>(
        mlx_array_get_(arr).data<mlx::core::bfloat16_t>());
  } catch (std::exception& e) {
    mlx_error(e.what());
    return nullptr;
  }
}
#endif
