#!/usr/bin/env bash
# Decode and prefill on the lent GPU, ours against llama.cpp's llama-bench on the same synthetic
# Gemma 4 Q4_K_M files (tools/make_synthetic_gemma4_gguf.py: real geometry, random weights), in one
# lease: prompt 512, 128 decoded tokens; ours the median of 3 processes (gemma4 bench --repeat 2),
# llama-bench's median of 3 repetitions with flash attention off and on; the weight-read floor (bytes
# one decode step reads at 4.3 TB/s, the copy bandwidth measured on these machines) beside each.
# Prints one table last.
#
# Run from the repository root on the GPU machine, with the CUDA build in build-cuda/bin and, carried
# beside the tree: .devlibs (host libraries the binary links), .whl (the gguf wheel), .devpeer
# (../shared/peer/llama_cuda_kit.sh pack .devpeer: llama.cpp's source, built there in the background
# while the files are written; ours are timed once that build is done).
#
#   [G4_VARIANTS="e2b e4b 26b-a4b 31b"] [G4_CONFIGS="bf16+int8 f32"] [G4_PROMPTS="512 2048"]
#   [G4_FILES="mlx4 mlx8 bf16w"] bash bench/cuda_vs_llamacpp.sh
#
# G4_PROMPTS: the prompt lengths (default 512): each row times the prefill of that prompt and the 128
# tokens decoded after it; llama-bench times its decode after an empty context, and for prompts over
# 512 also at that depth (-d P), which the row's ratio then uses.
# G4_FILES: also each variant's geometry as random-weight safetensors checkpoints
# (tools/make_synthetic_gemma4_checkpoint.py: mlx4, mlx8 = MLX affine 4 / 8 bits, group 64; bf16w =
# plain bf16), timed as ours with bf16 activations (rows "variant:file", each with its own floor;
# llama.cpp reads none of them, so they have no ratio).
#
# Configs: bf16+int8 (--dtype bf16: bf16 activations, int8 decode dots), bf16 (--int8-dots off), f32,
# nopdl (bf16+int8 with --cuda-pdl off: kernels launched without programmatic dependent launch),
# copies (bf16+int8 keeping bf16 copies of the weights cuBLAS reads, as serve does by default),
# nofuse (bf16+int8 with --cuda-fuse off: every decode matmul prepares its own int8 rows),
# foldprep (bf16+int8 with --cuda-fold-prep on: the decode attention does attn_prep's work).
# G4_BIN: the gemma4 binary (default build-cuda/bin/gemma4). Ours prefill in bench's default chunk
# (2048 rows on cuda, as run and serve do); llama-bench in its default n_ubatch (512) unless
# G4_LLAMA_UB sets -ub (2048: the same chunk on both sides).
source bench/cuda_env.sh
G4=${G4_BIN:-build-cuda/bin/gemma4}
VARIANTS=${G4_VARIANTS:-e2b e4b 26b-a4b 31b}
CONFIGS=${G4_CONFIGS:-bf16+int8 f32}
PROMPTS=${G4_PROMPTS:-512}
# The peer's build starts while the files are written (never twice: a second build would delete the first's tree).
[ -x /tmp/llb/bin/llama-bench ] || pgrep -f "/tmp/llb" > /dev/null || bash .devpeer/llama_cuda_kit.sh build .devpeer
for V in $VARIANTS; do  # the files, in parallel (numpy, one core each)
  [ -f /tmp/t-$V.gguf ] || (python3 tools/make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf --variant $V > /tmp/t-$V.log 2>&1 &)
done
# Safetensors checkpoints of the same geometry (G4_FILES: mlx4 = MLX affine 4-bit g64, mlx8 = 8-bit
# g64, bf16w = plain bf16), one at a time after the GGUF files (each is gigabytes of numpy work).
FILES=${G4_FILES:-}
file_args() {
  case $1 in mlx4) echo "--format mlx --bits 4 --group 64";; mlx8) echo "--format mlx --bits 8 --group 64";;
    bf16w) echo "--format bf16";; *) echo "unknown G4_FILES entry '$1' (mlx4, mlx8, bf16w)" >&2; return 1;; esac
}
for F in $FILES; do file_args $F > /dev/null || exit 2; done
if [ -n "$FILES" ]; then
  (for V in $VARIANTS; do for F in $FILES; do
     [ -f /tmp/m-$V-$F/config.json ] || python3 tools/make_synthetic_gemma4_checkpoint.py /tmp/m-$V-$F --variant $V \
       $(file_args $F) > /tmp/m-$V-$F.log 2>&1
   done; done) &
fi
for V in $VARIANTS; do
  for _ in $(seq 1 150); do grep -q '^decode_read_bytes' /tmp/t-$V.log 2>/dev/null && break; sleep 2; done
done
# Ours run only after the llama.cpp build has finished: a 16-job compile on the same cores slows
# the host side of every decode step (seen: ~1 ms between steps at E4B while it ran).
bash .devpeer/llama_cuda_kit.sh wait > /dev/null && LB=/tmp/llb/bin/llama-bench || LB=
R=$OUT/results.txt
: > $R
for V in $VARIANTS; do
  echo "floor $V $(awk '/^decode_read_bytes/ {print $2}' /tmp/t-$V.log)" >> $R
  for C in $CONFIGS; do
    case $C in f32) CA="--dtype f32";; bf16) CA="--dtype bf16 --int8-dots off";; nopdl) CA="--dtype bf16 --cuda-pdl off";;
      copies) CA="--dtype bf16 --cuda-bf16-cache 1024";; nofuse) CA="--dtype bf16 --cuda-fuse off";;
      foldprep) CA="--dtype bf16 --cuda-fold-prep on";;
      *) CA="--dtype bf16";; esac
    for P in $PROMPTS; do
      for i in 1 2 3; do
        timeout -s KILL 150 $G4 bench --model /tmp/t-$V.gguf --backend cuda $CA --prompt-tokens $P --gen-tokens 128 \
          --repeat 2 2>>$OUT/ours.err | tail -1 | sed "s/^/ours $V $C $P /" >> $R
      done
    done
    echo "$V $C done"
  done
  for F in $FILES; do  # the safetensors files: rows "V:F", bf16 activations with int8 dots
    for _ in $(seq 1 280); do grep -q '^decode_read_bytes' /tmp/m-$V-$F.log 2>/dev/null && break; sleep 2; done
    echo "floor $V:$F $(awk '/^decode_read_bytes/ {print $2}' /tmp/m-$V-$F.log 2>/dev/null)" >> $R
    for P in $PROMPTS; do
      for i in 1 2 3; do
        timeout -s KILL 200 $G4 bench --model /tmp/m-$V-$F --backend cuda --dtype bf16 --prompt-tokens $P --gen-tokens 128 \
          --repeat 2 2>>$OUT/ours.err | tail -1 | sed "s/^/ours $V:$F bf16+int8 $P /" >> $R
      done
    done
    echo "$V:$F done"
  done
done
CUDA_LIBS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null | tr '\n' ':')
for V in $VARIANTS; do
  [ -n "$LB" ] && LD_LIBRARY_PATH=$CUDA_LIBS$LD_LIBRARY_PATH timeout -s KILL 200 $LB -m /tmp/t-$V.gguf -p ${PROMPTS// /,} -n 128 \
    -ngl 99 -fa 0,1 ${G4_LLAMA_UB:+-ub $G4_LLAMA_UB} -r 3 -o jsonl 2>>$OUT/llama.err | sed "s/^/llama $V /" >> $R
  for P in $PROMPTS; do  # decode after a long prompt: llama-bench's decode at that depth too (-d)
    [ -n "$LB" ] && [ "$P" -gt 512 ] && LD_LIBRARY_PATH=$CUDA_LIBS$LD_LIBRARY_PATH timeout -s KILL 300 $LB -m /tmp/t-$V.gguf \
      -p 0 -n 128 -d $P -ngl 99 -fa 0,1 -r 3 -o jsonl 2>>$OUT/llama.err | sed "s/^/llama $V /" >> $R
  done
  echo "$V llama done"
done
python3 - "$R" <<'PY'
import json, statistics as st, sys
floor, ours, llama = {}, {}, {}
for line in open(sys.argv[1]):
    p = line.split(" ", 4)
    if p[0] == "floor" and len(p) > 2 and p[2].strip():
        floor[p[1]] = float(p[2])
    elif p[0] == "ours" and len(p) == 5 and p[4].startswith("{"):
        r = json.loads(p[4]); ours.setdefault((p[1], p[2], int(p[3])), []).append((r["prefill_tok_s"], r["decode_tok_s"]))
    elif p[0] == "llama" and len(p) >= 3:
        r = json.loads(line.split(" ", 2)[2]); n = r["n_prompt"] or 0
        # The median of llama-bench's repetitions: its first often carries a one-off cost (seen: 9.9k
        # tok/s beside 15.5k twice at E2B prefill 512), which its mean (avg_ts) would keep. Keyed by
        # (variant, prompt, depth, fa): a decode row has prompt 0, at depth 0 or at -d P.
        key = (p[1], n, r.get("n_depth") or 0, int(r.get("flash_attn", 0)))
        llama[key] = st.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"]
print("| variant | config | prompt | floor tok/s | ours decode | llama.cpp decode fa0 / fa1 | decode ratio | ours prefill | llama.cpp prefill fa0 / fa1 | prefill ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (v, c, n), rs in ours.items():
    pf, dc = st.median(x[0] for x in rs), st.median(x[1] for x in rs)
    fl = 4.3e12 / floor[v] if v in floor else float("nan")
    # A safetensors row ("V:F") is not a file llama.cpp reads: no peer figures beside it.
    # The peer's decode at our prompt's depth where it was run (prompts over 512), else after an empty context.
    d = n if any(k[:3] == (v, 0, n) for k in llama) else 0
    lt = [llama.get((v, 0, d, f)) for f in (0, 1)] if ":" not in v else [None, None]
    lp = [llama.get((v, n, 0, f)) for f in (0, 1)] if ":" not in v else [None, None]
    best_t = max([x for x in lt if x] or [float("nan")]); best_p = max([x for x in lp if x] or [float("nan")])
    f = lambda x: "%.0f" % x if x else "-"
    ratio = lambda a, b: "-" if b != b else f"{a / b:.2f}x"  # nan: no peer figure
    print(f"| {v} | {c} | {n} | {fl:.0f} | {dc:.1f} ({100 * dc / fl:.0f} % of floor) | {f(lt[0])} / {f(lt[1])} | {ratio(dc, best_t)} "
          f"| {pf:.0f} | {f(lp[0])} / {f(lp[1])} | {ratio(pf, best_p)} |")
PY
