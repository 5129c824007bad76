#!/usr/bin/env bash
# A decode step's kernels as they run inside its graph (Nsight Systems, graph nodes traced), on the
# GPU machine: `gemma4 bench` on a synthetic Gemma 4 Q4_K_M file, traced, then summarized per kernel
# by tools/cuda_step_trace.py (launches per step, median duration, the gap before each, the step's
# span). Nsight Compute (bench/cuda_h200_session.sh ncu) times each kernel alone; this shows how
# they overlap and wait in the replayed step.
#
# Run from the repository root with the CUDA build in build-cuda/bin, carried as for
# bench/cuda_vs_llamacpp.sh (.devlibs, .whl):
#
#   [G4_VARIANTS="e4b"] [G4_ARGS="--cuda-fold-prep on"] [G4_BIN=build-cuda/bin/gemma4] [G4_CUPTI_DIR=DIR]
#   [G4_PROMPT=64] [G4_TRACE_ARGS="--timeline 40"] bash bench/cuda_step_trace.sh
#
# G4_PROMPT is the prompt's length before the traced decode steps (their attention's context).
# G4_ARGS go to gemma4 bench, G4_TRACE_ARGS to tools/cuda_step_trace.py (--timeline N: a step's
# first N kernels in order, e.g. its first layer).
#
# Without nsys (the lent machines' image has none), G4_CUPTI_DIR names the folder that
# tools/cupti_trace/build.sh made (libg4_cupti_trace.so and libcupti.so.13, carried): the same
# run traced by CUPTI's kernel records instead, written in the columns the summarizer reads.
# Prints each variant's summary; the reports and CSVs stay in $OUT.
source bench/cuda_env.sh
G4=${G4_BIN:-build-cuda/bin/gemma4}
VARIANTS=${G4_VARIANTS:-e4b}
PROMPT=${G4_PROMPT:-64}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
CUPTI=${G4_CUPTI_DIR:-}
if [ -z "$NSYS" ] && [ ! -f "$CUPTI/libg4_cupti_trace.so" ]; then
  echo "cuda_step_trace: no nsys on this machine, and G4_CUPTI_DIR holds no libg4_cupti_trace.so" >&2
  exit 2
fi
for V in $VARIANTS; do
  [ -f /tmp/t-$V.gguf ] || python3 tools/make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf --variant $V > /tmp/t-$V.log 2>&1 || exit 1
  rep=$OUT/trace-$V
  if [ -z "$NSYS" ]; then
    rm -f "$rep.csv"  # the library loads into gemma4 alone (not into timeout), and writes once it has records
    timeout 300 env G4_CUPTI_TRACE=$rep.csv LD_PRELOAD=$(realpath "$CUPTI")/libg4_cupti_trace.so "$G4" bench \
      --model /tmp/t-$V.gguf --backend cuda --dtype bf16 --prompt-tokens $PROMPT --gen-tokens 12 --repeat 1 ${G4_ARGS:-} \
      > "$rep.log" 2>&1 || { tail -5 "$rep.log"; exit 1; }
    [ -s "$rep.csv" ] || { echo "cuda_step_trace: the CUPTI trace wrote no CSV for $V" >&2; tail -5 "$rep.log"; exit 1; }
    echo "== $V ${G4_ARGS:-} (CUPTI)"
    python3 tools/cuda_step_trace.py ${G4_TRACE_ARGS:-} "$rep.csv"
    continue
  fi
  timeout 300 "$NSYS" profile -t cuda --cuda-graph-trace=node -f true -o "$rep" "$G4" bench --model /tmp/t-$V.gguf \
    --backend cuda --dtype bf16 --prompt-tokens $PROMPT --gen-tokens 12 --repeat 1 ${G4_ARGS:-} > "$rep.log" 2>&1 || { tail -5 "$rep.log"; exit 1; }
  timeout 300 "$NSYS" stats -r cuda_gpu_trace -f csv -o "$rep" "$rep.nsys-rep" > /dev/null 2>&1
  csv=$(ls "$rep"*cuda_gpu_trace*.csv 2>/dev/null | head -1)
  [ -n "$csv" ] || { echo "cuda_step_trace: nsys stats wrote no CSV for $V" >&2; exit 1; }
  echo "== $V ${G4_ARGS:-}"
  python3 tools/cuda_step_trace.py ${G4_TRACE_ARGS:-} "$csv"
done
