#!/usr/bin/env bash
# Builds tools/cupti_trace/g4_cupti_trace.cpp into OUT_DIR/libg4_cupti_trace.so (`make cupti-trace`:
# build-cupti/), with CUPTI's headers and library from the pinned nvidia-cuda-cupti wheel (CUDA
# 13.0, as the CUDA build), and copies libcupti.so.13 beside it: carry OUT_DIR to the GPU machine
# and run bench/cuda_step_trace.sh with G4_CUPTI_DIR=OUT_DIR where the machine has no nsys.
#
#   bash tools/cupti_trace/build.sh [OUT_DIR (default build-cupti)]
set -euo pipefail
OUT=${1:-build-cupti}
WHEEL=nvidia-cuda-cupti==13.0.85
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
mkdir -p "$OUT/wheel"
if [ ! -f "$OUT/wheel/nvidia/cu13/include/cupti.h" ]; then
  python3 -m pip download --no-deps -q "$WHEEL" -d "$OUT/wheel"
  (cd "$OUT/wheel" && python3 -m zipfile -e nvidia_cuda_cupti-*.whl .)
fi
CUPTI=$OUT/wheel/nvidia/cu13
g++ -std=c++17 -O2 -fPIC -shared -Wall -Wextra -I"$CUPTI/include" -I"$CUDA_INC" \
  tools/cupti_trace/g4_cupti_trace.cpp -o "$OUT/libg4_cupti_trace.so" "$CUPTI/lib/libcupti.so.13" -Wl,-rpath,'$ORIGIN'
cp "$CUPTI/lib/libcupti.so.13" "$OUT/"
echo "built $OUT/libg4_cupti_trace.so (with $OUT/libcupti.so.13)"
