#!/usr/bin/env bash
# One call's worth of CUDA work on the lent GPU machine (see /work/.library/device): checks, then
# speed. Run from the repository root there, with the CUDA build's binaries in build-cuda/bin and,
# carried beside the tree (all git-ignored): .devlibs (the Debian libraries the binaries link that
# the GPU image lacks: libstb, libjpeg62, libedit, libtinfo, libbsd, libmd), .devfix (mlx-lm
# fixture folders from `make fixtures`), .whl (the gguf wheel), .devpeer (llama.cpp's source). The
# binaries travel stripped and xz-compressed (about 17 MB each) and are unpacked into build-cuda/bin.
#
#   [G4_SYNTH=e2b] bash bench/cuda_h200_session.sh [check] [bench] [kvbench] [profile] [hf] [llama] [speculative]
#
# check:   tools/cuda_device_check.py (op tests + mlx-lm fixtures, greedy through recorded graphs)
# bench:   gemma4 bench on a synthetic starter-geometry GGUF, CUDA graphs on and off (median of 5)
# tc:      the same with the tensor-core prefill matmul on and off (--tensor-cores off)
# profile: device time per op kind (--cuda-profile on)
# hf:      bench/bench_cuda_vs_hf.py (transformers peer)
# refcheck: tools/cuda_reference_check.py on the synthetic GGUF (cuda and cpu logits against the
#          exact f32 reference backend; where cpu and cuda greedy part, the reference's verdict)
# engine:  `gemma4 generate` (the engine: batching, device argmax) on the cpu and cuda backends
#          with the same prompt; prints both continuations and whether they agree
# serve:   `gemma4 serve --backend cuda --parallel 8` on the synthetic GGUF under bench/load_test.py
#          (1, 4, 8 concurrent streaming clients; greedy, sampled at temperature 0.8, and with top_k 64,
#          which samples from the device's top-k instead of copying the logits)
# kvbench: decode after a 4096-token prompt with the KV cache f32, --kv-bits 8 and 4 (speed, bytes)
# ablate:  device time per step with each op kind left out in turn (G4_CUDA_SKIP; timings only)
# ncu:     per-kernel device time from Nsight Compute (where the machine's runtime allows it);
#          G4_NCU_WINDOW="--launch-skip N --launch-count M" profiles a window (decode steps only),
#          G4_NCU_PROMPT the prompt length, G4_DTYPE the activations
# dtypes:  Gemma 4 geometries (G4_VARIANTS): ours with bf16 activations (the default) and --dtype f32 on
#          each synthetic file, prompt 512, 128 decoded tokens, medians of 3 processes
# gemma4:  Gemma 4 geometries (G4_VARIANTS="e2b e4b 26b-a4b 31b"): ours and llama-bench on each synthetic
#          file (tools/make_synthetic_gemma4_gguf.py), prompt 512, 128 decoded tokens
# speculative: bench/cuda_speculative.sh (G4_VARIANTS, default e4b): the verify forward at 1-8 rows,
#          rounds with a random drafter, the break-even acceptance
# peer:    starts building llama.cpp's llama-bench and llama-batched-bench with CUDA in the background
#          (../shared/peer/llama_cuda_kit.sh, packed into .devpeer); the gemma4 step waits for it
# formats: random-weight safetensors checkpoints (tools/make_synthetic_gemma4_checkpoint.py) in the
#          formats of G4_FORMATS (variant:format, format mlxB[gG][mM] = MLX affine B bits, group G,
#          mixed M on v/down; bf16), ours on CUDA, prompt 512, 128 decoded, medians of 3 processes,
#          with the weight-read floor at 4.3 TB/s
# compare: Gemma 4 geometries (G4_VARIANTS, default "e2b e4b"): ours in each activation mode (f32; bf16
#          with f32 dots, --int8-dots off; bf16 with int8 decode dots, the default of --dtype bf16), then
#          llama-bench (fa off / on) on the same synthetic Q4_K_M file; prompt 512, 128 decoded, medians
#          of 3 processes; the weight-read floor at 4.3 TB/s beside each (G4_CONFIGS: a subset of
#          "f32 bf16 bf16+int8")
# llama:   llama.cpp's llama-bench (CUDA build carried in .devllama) on the same GGUF. Made on the
#          workstation (the CUDA toolkit compiles there; ~30 min on 2 cores) from the llama.cpp that
#          the pinned llama-cpp-python sdist (requirements-peer.txt) vendors:
#            cmake -S <sdist>/vendor/llama.cpp -B /tmp/llcuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
#              -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
#            cmake --build /tmp/llcuda --target llama-bench -j2
#            strip /tmp/llcuda/bin/llama-bench && xz -c /tmp/llcuda/bin/llama-bench > .devllama/llama-bench.xz
#            cp /lib/x86_64-linux-gnu/libgomp.so.1 .devllama/
# Logs go to $OUT (or /tmp/out).
source bench/cuda_env.sh
B=build-cuda/bin
# The model every step runs: G4_SYNTH=starter (default; the starter's geometry, Gemma 3) or a Gemma 4
# variant of tools/make_synthetic_gemma4_gguf.py (e2b, e4b, 26b-a4b, 31b), random Q4_K_M-like weights.
SYNTH=${G4_SYNTH:-starter}
if [ "$SYNTH" = starter ]; then G=/tmp/synth.gguf; MAKE_G="tools/make_synthetic_gguf.py $G --vocab"
else G=/tmp/synth-$SYNTH.gguf; MAKE_G="tools/make_synthetic_gemma4_gguf.py $G --variant $SYNTH"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
[ -f $G ] || python3 $MAKE_G 2>/dev/null || exit 1
median_bench() {  # median decode / prefill of 5 processes; extra gemma4 bench options as args
  for i in 1 2 3 4 5; do timeout -s KILL 120 $B/gemma4 bench --model $G --backend cuda --prompt-tokens 128 \
    --gen-tokens 128 --repeat 2 "$@" 2>/dev/null | tail -1; done | python3 -c '
import json,sys,statistics as s
r=[json.loads(l) for l in sys.stdin if l.startswith("{")]
print("prefill %.1f decode %.1f tok/s (median of %d)" % (s.median(x["prefill_tok_s"] for x in r), s.median(x["decode_tok_s"] for x in r), len(r)))'
}
run_median() {  # LABEL, then gemma4 bench options: median of 3 processes at prompt 512, 128 decoded
  local label=$1; shift
  for i in 1 2 3; do timeout -s KILL 150 $B/gemma4 bench --backend cuda --prompt-tokens 512 --gen-tokens 128 \
    --repeat 2 "$@" 2>$OUT/bench.err | tail -1; done | python3 -c '
import json,sys,statistics as s
r=[json.loads(l) for l in sys.stdin if l.startswith("{")]
print("'"$label"' ours: prefill %.0f decode %.1f tok/s (median of %d)" % (s.median(x["prefill_tok_s"] for x in r), s.median(x["decode_tok_s"] for x in r), len(r)) if r else "'"$label"' ours: FAILED")' || true
  [ -s $OUT/bench.err ] && grep -iE "error|abort|fail" $OUT/bench.err | head -3
}
DTYPE_ARGS=${G4_DTYPE:+--dtype $G4_DTYPE}
for step in "$@"; do
  echo "=== $step"
  case $step in
    check) vis=$(ls -d .devfix/vision/*/ 2>/dev/null)
           # the bf16 contract on a random-weight E4B-geometry file too (against the cuda f32 path)
           CG=/tmp/synth-e4b.gguf; [ -f $CG ] || python3 tools/make_synthetic_gemma4_gguf.py $CG --variant e4b >/dev/null 2>&1
           timeout -s KILL 420 python3 tools/cuda_device_check.py --bin $B --fixtures .devfix/* \
             ${vis:+--vision $vis} --gguf $CG 2>&1 | tee $OUT/check.log | tail -45 ;;
    dtypes)
      for V in ${G4_VARIANTS:-e2b e4b}; do
        GV=/tmp/synth-$V.gguf
        [ -f $GV ] || python3 tools/make_synthetic_gemma4_gguf.py $GV --variant $V >/dev/null 2>&1
        for DT in bf16 f32; do
          for i in 1 2 3; do timeout -s KILL 120 $B/gemma4 bench --model $GV --backend cuda --dtype $DT \
            --prompt-tokens 512 --gen-tokens 128 --repeat 2 2>/dev/null | tail -1; done | python3 -c '
import json,sys,statistics as s
r=[json.loads(l) for l in sys.stdin if l.startswith("{")]
print("'$V' '$DT': prefill %.0f decode %.1f tok/s (median of %d)" % (s.median(x["prefill_tok_s"] for x in r), s.median(x["decode_tok_s"] for x in r), len(r)))'
        done
      done ;;
    tc)  # the tensor-core prefill path against the CUDA-core kernels it replaces, and
         # prefill at the prompt lengths of the llama step
      echo "tensor cores on:  $(median_bench --tensor-cores on)"
      echo "tensor cores off: $(median_bench --tensor-cores off)"
      for P in 128 512 2048; do
        echo "prompt $P: $(timeout -s KILL 120 $B/gemma4 bench --model $G --backend cuda --prompt-tokens $P \
          --gen-tokens 128 --repeat 3 2>/dev/null | tail -1)"
      done ;;
    bench)
      echo "graphs on:  $(median_bench --cuda-graphs on)"
      echo "graphs off: $(median_bench --cuda-graphs off)"
      nvidia-smi dmon -s pc -c 6 > $OUT/dmon.log 2>&1 &
      timeout -s KILL 120 $B/gemma4 bench --model $G --backend cuda --prompt-tokens 128 \
        --gen-tokens 2000 --cuda-timing on 2>&1 | grep -E "cuda timing|decode"
      wait; cat $OUT/dmon.log ;;
    kvbench)
      for kv in "" "--kv-bits 8 --quantized-kv-start 0" "--kv-bits 4 --quantized-kv-start 0"; do
        echo "kv [${kv:-f32}]: $(timeout -s KILL 120 $B/gemma4 bench --model $G --backend cuda --prompt-tokens 4096 \
          --gen-tokens 256 --repeat 2 $kv 2>/dev/null | tail -1)"
      done ;;
    profile) timeout -s KILL 120 $B/gemma4 bench --model $G --backend cuda --prompt-tokens 128 \
      --gen-tokens 128 --cuda-profile on 2>&1 | tee $OUT/profile.log | head -40 ;;
    refcheck) timeout -s KILL 300 python3 tools/cuda_reference_check.py --bin $B/gemma4 --gguf $G 2>&1 | tail -6 ;;
    engine)
      for be in cpu cuda; do
        timeout -s KILL 120 $B/gemma4 generate --model $G --backend $be --max-tokens 24 "tok500 tok600 tok700 tok800" \
          > $OUT/gen_$be.txt 2> $OUT/gen_$be.err; echo "$be: $(head -c 300 $OUT/gen_$be.txt)"; tail -1 $OUT/gen_$be.err
      done
      cmp -s $OUT/gen_cpu.txt $OUT/gen_cuda.txt && echo "engine: cpu and cuda continuations identical" \
        || echo "engine: continuations differ" ;;
    serve)
      $B/gemma4 serve --model $G --backend cuda --parallel 8 --port 8091 > $OUT/serve.log 2>&1 &
      SRV=$!
      python3 -c 'import time, urllib.request
for _ in range(120):
    try: urllib.request.urlopen("http://127.0.0.1:8091/health", timeout=1); break
    except Exception: time.sleep(0.5)'
      for args in "--temperature 0" "--temperature 0.8" "--temperature 0.8 --top-k 64"; do
        echo "load_test $args"
        timeout -s KILL 200 python3 bench/load_test.py --url http://127.0.0.1:8091 --clients 1,4,8 --requests 2 \
          --max-tokens 64 $args 2>&1 | tail -5
      done
      kill $SRV; wait $SRV 2>/dev/null; tail -2 $OUT/serve.log ;;
    ablate)
      for skip in ${G4_ABLATE:-none big_matmul matmul matmul_norm_add attn_prep norm_matmuls gate_up_gelu attention norm_add \
                  embed argmax}; do
        t=$(G4_CUDA_SKIP=$skip timeout -s KILL 60 $B/gemma4 bench --model $G --backend cuda \
          --prompt-tokens 128 --gen-tokens 300 --cuda-timing on $DTYPE_ARGS 2>&1 | grep -o "device time of the step's work [0-9.]* us")
        echo "skip $skip: $t"
      done ;;
    ncu) timeout -s KILL 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv ${G4_NCU_WINDOW:-} \
      $B/gemma4 bench --model $G --backend cuda --prompt-tokens ${G4_NCU_PROMPT:-64} --gen-tokens 8 $DTYPE_ARGS \
      > $OUT/ncu.csv 2>$OUT/ncu.err; tail -3 $OUT/ncu.err
      python3 - $OUT/ncu.csv <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if len(rows) < 2: sys.exit("no ncu rows")
h = rows[0]; K, G, V = h.index("Kernel Name"), h.index("Grid Size"), h.index("Metric Value")
acc = collections.defaultdict(lambda: [0.0, 0])
for r in rows[1:]:
    name = re.sub(r"\(.*", "", r[K]).split("::")[-1][:60]
    a = acc[(name, r[G])]; a[0] += float(r[V].replace(",", "")) / 1e3; a[1] += 1
tot = sum(a[0] for a in acc.values())
print(f"total {tot:.1f} us over {sum(a[1] for a in acc.values())} kernels")
for (n, g), (us, c) in sorted(acc.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"{us:9.1f} us {c:5d}x {us / c:8.2f} us  {n} grid {g}")
PY
      ;;
    hf) timeout -s KILL 300 python3 bench/bench_cuda_vs_hf.py --bin $B/gemma4 --gguf $G --gen-tokens 128 2>&1 | tail -5 ;;
    peer) bash .devpeer/llama_cuda_kit.sh build .devpeer ;;
    speculative) G4_BIN=$B/gemma4 bash bench/cuda_speculative.sh 2>&1 | tail -6 ;;
    formats)
      for VF in ${G4_FORMATS:-e2b:mlx4 e4b:mlx4 e4b:mlx8 e4b:bf16}; do
        V=${VF%%:*}; FM=${VF#*:}; D=/tmp/ck-$V-$FM; rm -rf $D
        if [ "$FM" = bf16 ]; then GA="--format bf16"
        else b=${FM#mlx}; GA="--format mlx --bits ${b%%[gm]*}"
          case $b in *g*) g=${b#*g}; GA="$GA --group ${g%%m*}";; esac
          case $b in *m*) GA="$GA --mixed ${b#*m}";; esac; fi
        FLOOR=$(python3 tools/make_synthetic_gemma4_checkpoint.py $D --variant $V $GA 2>/dev/null | awk '/^decode_read_bytes/ {print $2}')
        run_median "$V $FM f32" --model $D --dtype f32
        run_median "$V $FM bf16+int8" --model $D --dtype bf16
        echo "  floor: $(python3 -c "print('%.0f tok/s (%.2f GB read per token at 4.3 TB/s)' % (4.3e12 / $FLOOR, $FLOOR / 1e9))")"
        rm -rf $D
      done ;;
    compare)
      LB=; if [ -d .devpeer ]; then bash .devpeer/llama_cuda_kit.sh wait >/dev/null && LB=/tmp/llb/bin/llama-bench; fi
      CUDA_LIBS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null | tr '\n' ':')
      for V in ${G4_VARIANTS:-e2b e4b}; do
        GV=/tmp/synth-$V.gguf
        FLOOR=$(python3 tools/make_synthetic_gemma4_gguf.py $GV --variant $V 2>/dev/null | awk '/^decode_read_bytes/ {print $2}')
        [ -n "$FLOOR" ] && echo "$V floor: $(python3 -c "print('%.0f tok/s (%.2f GB read per token at 4.3 TB/s)' % (4.3e12 / $FLOOR, $FLOOR / 1e9))")"
        for C in ${G4_CONFIGS:-f32 bf16 bf16+int8}; do
          case $C in f32) CA="--dtype f32";; bf16) CA="--dtype bf16 --int8-dots off";; *) CA="--dtype bf16";; esac
          run_median "$V $C" --model $GV $CA
        done
        [ -n "$LB" ] && LD_LIBRARY_PATH=$CUDA_LIBS$LD_LIBRARY_PATH timeout -s KILL 240 $LB -m $GV -p 512 \
          -n 128 -ngl 99 -fa 0,1 -r 3 -o md 2>&1 | grep -E "pp512|tg128"
        rm -f $GV
      done ;;
    gemma4)  # Gemma 4 geometries (G4_VARIANTS, default "e2b e4b"): synthetic Q4_K_M-like GGUFs, ours
             # (median of 3 processes) then llama-bench on the same file, prompt 512 and 128 decoded
      LB=/tmp/llb/bin/llama-bench
      if [ -d .devpeer ]; then bash .devpeer/llama_cuda_kit.sh wait || LB=; else
        [ -x /tmp/llama-bench ] || xz -d -c .devllama/llama-bench.xz > /tmp/llama-bench && chmod +x /tmp/llama-bench
        LB=/tmp/llama-bench; fi
      CUDA_LIBS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null | tr '\n' ':')
      for V in ${G4_VARIANTS:-e2b e4b}; do
        GV=/tmp/synth-$V.gguf
        FLOOR=$(python3 tools/make_synthetic_gemma4_gguf.py $GV --variant $V 2>/dev/null | awk '/^decode_read_bytes/ {print $2}')
        run_median "$V Q4_K_M" --model $GV $DTYPE_ARGS
        [ -n "$FLOOR" ] && echo "  floor: $(python3 -c "print('%.0f tok/s (%.2f GB read per token at 4.3 TB/s)' % (4.3e12 / $FLOOR, $FLOOR / 1e9))")"
        [ -n "$LB" ] && LD_LIBRARY_PATH=$PWD/.devllama:$CUDA_LIBS$LD_LIBRARY_PATH timeout -s KILL 240 $LB -m $GV -p 512 \
          -n 128 -ngl 99 -fa 0,1 -r 3 -o md 2>&1 | grep -E "pp512|tg128"
        rm -f $GV
      done ;;
    llama)  # .devllama: llama-bench.xz (a static CUDA build, sm_90) and libgomp.so.1
      xz -d -c .devllama/llama-bench.xz > /tmp/llama-bench && chmod +x /tmp/llama-bench
      CUDA_LIBS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null | tr '\n' ':')
      LD_LIBRARY_PATH=$PWD/.devllama:$CUDA_LIBS$LD_LIBRARY_PATH timeout -s KILL 300 /tmp/llama-bench -m $G -p 128,512,2048 \
        -n 128 -ngl 99 -fa 0,1 -r 5 -o md 2>&1 | tee $OUT/llama.log | tail -12 ;;
  esac
done
