/* Bindgen-only prelude. mlx-c's half.h defines float16_t / bfloat16_t only
 * on aarch64; elsewhere the accessor declarations in array.h would not
 * parse. Both are 16-bit storage types, passed by pointer. */
#ifndef MLX_SYS_HALF_SHIM_H
#define MLX_SYS_HALF_SHIM_H
#include <stdint.h>
#if !(defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC) || defined(__aarch64__))
#define HAS_FLOAT16
typedef uint16_t float16_t;
#endif
#if !(defined(__ARM_FEATURE_BF16) || defined(__aarch64__))
#define HAS_BFLOAT16
typedef uint16_t bfloat16_t;
#endif
#endif
