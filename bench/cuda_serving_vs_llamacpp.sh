#!/usr/bin/env bash
# Concurrent serving on the lent GPU, ours against llama.cpp in one lease on the same synthetic
# Gemma 4 Q4_K_M file (tools/make_synthetic_gemma4_gguf.py: real geometry, random weights):
#   ours:  `gemma4 serve --backend cuda --parallel 64` under bench/load_test.py: N streaming clients,
#          greedy /v1/completions, 128 output tokens per request, 2 requests per client; aggregate
#          output tok/s over the wall time (prompt processing included), TTFT and ITL p50 / p99;
#   peer:  llama-batched-bench -npl N (the same prompt length in tokens, 128 generated, flash
#          attention on): S_TG, its aggregate generation tok/s (prompt processing excluded).
# Prints one table last.
#
# Run from the repository root on the GPU machine, with the CUDA build in build-cuda/bin and, carried
# beside the tree: .devlibs, .whl (the gguf wheel), .devpeer (llama.cpp's source; see
# bench/cuda_vs_llamacpp.sh).
#
#   [G4_VARIANTS="e4b 26b-a4b 31b"] [G4_CLIENTS="1,8,32,64"] [G4_BINS="build-cuda/bin/gemma4 /tmp/old/gemma4"] \
#     bash bench/cuda_serving_vs_llamacpp.sh
#
# G4_BINS: the gemma4 binaries to serve with, one after another (A/B of two builds in one lease).
# G4_SERVE_ARGS: extra `serve` flags (e.g. "--cuda-bf16-cache 16").
# G4_PEER=0: ours only (no waiting for llama.cpp's build, no llama-batched-bench).
source bench/cuda_env.sh
VARIANTS=${G4_VARIANTS:-e4b}
CLIENTS=${G4_CLIENTS:-1,8,32,64}
BINS=${G4_BINS:-build-cuda/bin/gemma4}
GEN=128
PROMPT="Once upon a time, robot number 1"  # load_test.py's completion prompt (its number varies)
[ -x /tmp/llb/bin/llama-batched-bench ] || pgrep -f "/tmp/llb" > /dev/null || bash .devpeer/llama_cuda_kit.sh build .devpeer
for V in $VARIANTS; do
  [ -f /tmp/t-$V.gguf ] || (python3 tools/make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf --variant $V > /tmp/t-$V.log 2>&1 &)
done
for V in $VARIANTS; do
  for _ in $(seq 1 150); do grep -q '^decode_read_bytes' /tmp/t-$V.log 2>/dev/null && break; sleep 2; done
done
LBB=
[ "${G4_PEER:-1}" = 0 ] || { bash .devpeer/llama_cuda_kit.sh wait > /dev/null && LBB=/tmp/llb/bin/llama-batched-bench; }
R=$OUT/serving.txt
: >> $R
port=8190
for V in $VARIANTS; do
  NPP=0
  for BIN in $BINS; do
    port=$((port + 1))
    $BIN serve --model /tmp/t-$V.gguf --backend cuda --parallel 64 --port $port ${G4_SERVE_ARGS:-} > $OUT/serve-$V-$port.log 2>&1 &
    SRV=$!
    python3 -c 'import sys, time, urllib.request
for _ in range(240):
    try: urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1); break
    except Exception: time.sleep(0.5)' $port
    NPP=$(python3 -c 'import json, sys, urllib.request
r = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/tokenize", json.dumps({"content": sys.argv[2]}).encode(),
                           {"Content-Type": "application/json"})
print(len(json.load(urllib.request.urlopen(r, timeout=30))["tokens"]))' $port "$PROMPT" 2>/dev/null || echo 0)
    [ "$NPP" -gt 0 ] 2>/dev/null || NPP=32
    timeout -s KILL 500 python3 bench/load_test.py --url http://127.0.0.1:$port --clients $CLIENTS --requests 2 \
      --max-tokens $GEN --temperature 0 2>>$OUT/load.err | grep '^{' | sed "s|^|ours $V $BIN |" >> $R
    kill $SRV; wait $SRV 2>/dev/null
    echo "$V $BIN done (prompt $NPP tokens)"
  done
  [ -n "$LBB" ] && LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH timeout -s KILL 400 $LBB -m /tmp/t-$V.gguf \
    -c $((64 * (NPP + GEN) + 256)) -b 2048 -ub 512 -npp $NPP -ntg $GEN -npl $CLIENTS -ngl 99 -fa on \
    2>>$OUT/llama.err | grep '^|' | sed "s/^/llama $V /" >> $R
  echo "$V llama done"
done
python3 - "$R" <<'PY'
import json, sys
ours, llama = {}, {}
for line in open(sys.argv[1]):
    p = line.split(" ", 3)
    if p[0] == "ours" and len(p) == 4:
        r = json.loads(p[3]); ours[(p[1], p[2], r["clients"])] = r
    elif p[0] == "llama":
        cells = [c.strip() for c in line.split(" ", 2)[2].strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():  # PP TG B N_KV T_PP S_PP T_TG S_TG T S
            llama[(p[1], int(cells[2]))] = float(cells[7])
print("| variant | binary | streams | ours tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | errors | llama.cpp S_TG | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for (v, b, n), r in sorted(ours.items()):
    peer = llama.get((v, n))
    ratio = f"{r['out_tok_per_s'] / peer:.2f}" if peer else "-"
    print(f"| {v} | {b} | {n} | {r['out_tok_per_s']:.0f} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | "
          f"{r['itl_p50_ms']} / {r['itl_p99_ms']} | {r['errors']} | {peer if peer else '-'} | {ratio} |")
PY
