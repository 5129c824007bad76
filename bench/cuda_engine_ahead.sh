#!/usr/bin/env bash
# The engine's decode steps queued ahead (runtime/engine_ahead.cpp) on the lent GPU: the device's
# top-k draw against the host's and the engine's queued steps against plain steps (the CUDA
# instances of DrawTop.* and EngineAhead.*), then `gemma4 generate` tok/s with --decode-ahead off
# and on, alternating, sampled (Gemma 4's generation_config: temperature 1, top_k 64, top_p 0.95)
# and greedy, with the texts compared. Run from the repository root there with the CUDA build in
# build-cuda/bin and .devlibs, .whl and .devfix (the mlx-lm fixtures) carried, as for
# bench/cuda_vs_llamacpp.sh:
#
#   [G4_VARIANTS="e4b 26b-a4b"] [G4_REPEAT=2] bash bench/cuda_engine_ahead.sh
source bench/cuda_env.sh
B=${G4_BIN_DIR:-build-cuda/bin}
VARIANTS=${G4_VARIANTS:-e4b 26b-a4b}
REPEAT=${G4_REPEAT:-2}
for V in $VARIANTS; do
  [ -f /tmp/t-$V.gguf ] || (python3 tools/make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf --variant $V > /tmp/t-$V.log 2>&1 &)
done
export G4_FIXTURE_DIR=${G4_FIXTURE_DIR:-$PWD/.devfix}
timeout -s KILL 60 $B/test_backend --gtest_filter='DrawTop*' > $OUT/draw_top.log 2>&1
echo "DrawTop rc=$?"; grep -E "draw_top:|OK \]|FAILED|Failure" $OUT/draw_top.log
timeout -s KILL 120 $B/test_server --gtest_filter='EngineAhead*' > $OUT/engine_ahead.log 2>&1
echo "EngineAhead rc=$?"; grep -E "OK \]|FAILED|Failure|SKIP" $OUT/engine_ahead.log
for V in $VARIANTS; do
  for _ in $(seq 1 150); do grep -q '^decode_read_bytes' /tmp/t-$V.log 2>/dev/null && break; sleep 2; done
  for T in 1 0; do
    for _ in $(seq 1 "$REPEAT"); do
      for A in off on; do
        timeout -s KILL 120 $B/gemma4 generate --model /tmp/t-$V.gguf --backend cuda -n 128 --temp $T --top-k 64 \
          --top-p 0.95 --seed 3 --decode-ahead $A "The quick brown fox jumps over the lazy dog and then" \
          2>$OUT/gen.err >$OUT/gen-$V-$A-$T.out
        echo "$V temp=$T ahead=$A: $(grep -o 'decode: .*' $OUT/gen.err)"
      done
    done
    cmp -s $OUT/gen-$V-on-$T.out $OUT/gen-$V-off-$T.out && echo "$V temp=$T: the same text on and off" \
      || echo "$V temp=$T: the text DIFFERS on and off"
  done
done
