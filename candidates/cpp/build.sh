#!/bin/sh
# Builds the C++ example candidate against the pinned mlx wheel's headers
# and libmlx: sh candidates/cpp/build.sh MLX_DIR OUT
# MLX_DIR is the wheel's `mlx` package directory (`mlx_dir` in
# .reference/fingerprint.json); the rpath makes OUT load that libmlx file.
set -eu
if [ $# -ne 2 ]; then
  echo "usage: sh $0 MLX_DIR OUT" >&2
  exit 2
fi
mlx=$1
out=$2
for need in "$mlx/include/mlx/mlx.h" "$mlx/lib/libmlx.so"; do
  [ -e "$need" ] || [ -e "${need%.so}.dylib" ] || { echo "build.sh: $need not found (MLX_DIR is the wheel's mlx directory; run cargo xtask setup)" >&2; exit 1; }
done
here=$(dirname "$0")
mkdir -p "$(dirname "$out")"
# Written beside OUT first, so an interrupted build leaves no half binary.
${CXX:-g++} -std=c++20 -O1 -o "$out.tmp" "$here/mlx_cpp_candidate.cpp" \
  -I"$mlx/include" -L"$mlx/lib" -lmlx -Wl,-rpath,"$mlx/lib" -ldl
mv "$out.tmp" "$out"
