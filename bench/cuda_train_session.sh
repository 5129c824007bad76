#!/usr/bin/env bash
# LoRA training on the lent GPU machine (issue 22): the checks, then the speed against PEFT. Run from
# the repository root there, with a CUDA build's gemma4 and test_train in $G4_BIN (default
# build-cuda/bin), carried beside the tree as for bench/cuda_h200_session.sh (.devlibs, .whl), plus:
#   G4_FIXTURE_DIR  mlx-lm fixture folders (`make fixtures`: dense-bf16, estyle-q8g32, moe-q4g64, ...)
#   G4_TRAIN_CASES  tools/make_lora_train_oracle.py's case folders (tests/fixtures/generated/lora-train)
#   .whl-train      the wheels of PEFT and of a transformers with Gemma 4 (pip download --no-deps),
#                   installed for the PEFT run only
#
#   bash bench/cuda_train_session.sh [tests] [check] [peft]      (default: all three)
#
# tests: test_train's Cuda* tests (every op of the CUDA arithmetic against the host's with the
#        products on the reference kernels, cuBLAS f32 and cuBLAS bf16; whole training steps on the
#        fixtures against the host);
# check: tools/cuda_train_check.py on the cases (cuda f32 and bf16 against mlx-lm's losses, bf16
#        against f32, f32 against the host);
# peft:  bench/bench_lora_cuda_vs_peft.py at E4B geometry, 4 x 2048 tokens, rank 8 (G4_PEFT_ARGS
#        adds flags), ours in f32 and with --dtype bf16 (and --cuda-bf16-cache 16).
set -u
source bench/cuda_env.sh
BIN=${G4_BIN:-build-cuda/bin}
STEPS=${*:-tests check peft}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for step in $STEPS; do
  echo "=== $step ($SECONDS s)"
  case $step in
    tests)
      timeout 500 "$BIN/test_train" --gtest_filter='Cuda*' > "$OUT/test_train.txt" 2>&1
      echo "test_train: exit $?"
      grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|Failure|worst gradient|max \|cuda" "$OUT/test_train.txt" | head -80 ;;
    check)
      python3 tools/cuda_train_check.py --bin "$BIN/gemma4" "${G4_TRAIN_CASES:?G4_TRAIN_CASES: the lora-train cases}"/* ;;
    peft)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-train .whl-train/*.whl
      for dtype in f32 bf16; do
        # ours alone per dtype (the PEFT run once, with the bf16 run)
        skip=--skip-peft
        [ $dtype = bf16 ] && skip=
        # bf16 with the weights' bf16 copies kept (PEFT holds bf16 weights too)
        cache=
        [ $dtype = bf16 ] && cache="--cuda-bf16-cache 16"
        PYTHONPATH=/tmp/site-train:${PYTHONPATH:-} G4_LORA_DTYPE=$dtype python3 bench/bench_lora_cuda_vs_peft.py \
          --bin "$BIN/gemma4" --json "$OUT/peft-$dtype.json" --ours-args "$cache" $skip ${G4_PEFT_ARGS:-}
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "done in $SECONDS s"
