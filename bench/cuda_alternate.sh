#!/usr/bin/env bash
# Device time of a decode step for several builds (or flag sets), run alternately in one lease:
# each round runs every build once on every variant, one `gemma4 bench` process each (prompt
# G4_PROMPT, 128 decoded, --repeat 2, --cuda-timing on), so that drift of the card's clocks and
# temperature falls on every build alike. Prints a line per process, then the table of
# tools/alternate_summary.py: per variant and build, each run's device µs a step, their median and
# its change against the first build. The RUN lines stay in $OUT/alternate.txt.
#
# Run from the repository root on the GPU machine, carried as for bench/cuda_vs_llamacpp.sh
# (.devlibs, .whl):
#
#   G4_BUILDS="base=/tmp/pk/base/gemma4 new=/tmp/pk/new/gemma4" [G4_VARIANTS="e2b e4b 26b-a4b 31b"]
#   [G4_ROUNDS=2] [G4_PROMPT=512] [G4_ARGS="--dtype bf16"] bash bench/cuda_alternate.sh
#
# A build's own flags follow its path after commas: "split128=/tmp/pk/base/gemma4,--cuda-attn-split,128"
# (the same binary with a flag, against itself without). G4_ARGS go to every run (default
# --dtype bf16). The files are tools/make_synthetic_gemma4_gguf.py's Q4_K_M at each variant's
# geometry, made in /tmp/t-VARIANT.gguf when missing.
source bench/cuda_env.sh
BUILDS=${G4_BUILDS:?G4_BUILDS: name=path[,flag,...] of each build, space separated}
VARIANTS=${G4_VARIANTS:-e2b e4b 26b-a4b 31b}
ROUNDS=${G4_ROUNDS:-2}
PROMPT=${G4_PROMPT:-512}
ARGS=${G4_ARGS:---dtype bf16}
for B in $BUILDS; do
  spec=${B#*=}
  [ -x "${spec%%,*}" ] || { echo "cuda_alternate: ${B%%=*}: no executable at ${spec%%,*}" >&2; exit 2; }
done
for V in $VARIANTS; do  # the files, in parallel (numpy, one core each)
  [ -f /tmp/t-$V.gguf ] || (python3 tools/make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf --variant $V > /tmp/t-$V.log 2>&1 &)
done
sleep 1
R=$OUT/alternate.txt
: > $R
for V in $VARIANTS; do
  while pgrep -f "make_synthetic_gemma4_gguf.py /tmp/t-$V.gguf" > /dev/null; do sleep 2; done
  if [ ! -f /tmp/t-$V.gguf ] || { [ -f /tmp/t-$V.log ] && ! grep -q '^decode_read_bytes' /tmp/t-$V.log; }; then
    echo "cuda_alternate: /tmp/t-$V.gguf was not made (/tmp/t-$V.log)" >&2
    continue
  fi
  for r in $(seq 1 $ROUNDS); do
    for B in $BUILDS; do
      name=${B%%=*} spec=${B#*=}
      bin=${spec%%,*} flags=
      [ "$spec" != "$bin" ] && flags=${spec#*,} && flags=${flags//,/ }
      # shellcheck disable=SC2086  # ARGS and flags are word lists
      log=$(timeout -s KILL 150 "$bin" bench --model /tmp/t-$V.gguf --backend cuda $ARGS --prompt-tokens $PROMPT \
        --gen-tokens 128 --repeat 2 --cuda-timing on $flags 2>&1)
      tok=$(grep -o '"decode_tok_s": *[0-9.]*' <<< "$log" | tail -1 | grep -o '[0-9.]*$')
      us=$(grep -o "device time of the step's work [0-9.]*" <<< "$log" | tail -1 | grep -o '[0-9.]*$')
      echo "RUN $V $name ${tok:--} ${us:--}" | tee -a $R
      [ -n "$us" ] || grep -iE "error|abort" <<< "$log" | head -3
    done
  done
done
python3 tools/alternate_summary.py $R
