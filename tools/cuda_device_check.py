#!/usr/bin/env python3
"""Checks the CUDA backend on a machine with a GPU (the lent H200; CI has none).

Runs, with a CUDA build of the binaries (cmake -DG4_CUDA=ON):
  1. test_backend (the op-level comparisons with the reference backend, tests/backend);
  2. for every mlx-lm fixture directory given (tests/fixtures/generated/<name>, as made by
     `make fixtures`): `gemma4 logits --backend cuda --dtype f32` against mlx-lm's f32 logits in
     oracle.npz (max |Δ|, and the cpu backend's max |Δ| for scale), and `gemma4 greedy --backend
     cuda` against mlx-lm's greedy ids;
  3. where a fixture has kvquant.npz (tools/make_kvquant_oracle.py): `gemma4 logits --backend cuda`
     with each recorded quantized-KV schedule against mlx-lm's logits, with the bound of
     tests/python/test_kvquant.py (max(1e-3, 3 x mlx-lm's own rounding sensitivity));
  4. where a fixture has a sibling FIXTURE-lora (tools/make_lora_oracle.py): `gemma4 logits
     --backend cuda --adapter-path` against mlx-lm's logits with that adapter (1e-3);
  5. where the fixtures' folder has drafters/FIXTURE-drafter* (tools/make_mtp_oracle.py): `gemma4
     draft --backend cuda` drafts and logits against mlx-vlm's (2e-3), and speculative greedy
     decoding round by round;
  6. for every vision case folder given with --vision (tools/make_vision_oracle.py): the vision
     encoder's features (5e-4) and image-conditioned logits (1e-3) against mlx-vlm's;
  7. the bf16 accuracy contract (CUDA's default activations on the command line): on every fixture
     `gemma4 logits --backend cuda --dtype bf16` against the exact f32 reference backend, once with
     the prompt in one forward and once a token per forward (--chunk 1: the decode path, int8 dots):
     no farther than mlx-lm's own bf16 logits are from its f32 logits (KL no larger, top-1 no
     lower); the issue's absolute bound (top-1 >= 99 %, mean KL <= 1e-3, 16-step greedy identical on
     >= 90 % of fixtures) is reported beside it. With --gguf FILE (a random-weight Gemma 4 geometry
     file, tools/make_synthetic_gemma4_gguf.py): cuda bf16 against the cuda f32 path on a 64-token
     prompt, no farther than the cpu backend's bf16 rounding mode from its f32 path. With --real
     MODEL (a checkpoint with trained weights: the starter model, build/starter or the GGUF that
     tools/starter_model.py assembles): the issue's absolute bound itself, on natural-text prompts,
     cuda bf16 (both paths) against the exact f32 reference backend.
Prints one line per check and a summary table last; exits 1 if any check fails.

    python3 tools/cuda_device_check.py --bin build-cuda/bin --fixtures DIR [DIR ...]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

LOGIT_TOL = 1e-3  # f32 on both sides: the cpu backend lands near 2e-4 on these fixtures


def run(cmd, input=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, input=input)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:200]} failed ({r.returncode}): {r.stderr[-1500:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with gemma4 and test_backend (CUDA build)")
    ap.add_argument("--fixtures", nargs="*", default=[])
    ap.add_argument("--vision", nargs="*", default=[], help="vision case folders (FIXTURES/vision/<case>)")
    ap.add_argument("--gguf", nargs="*", default=[], help="synthetic Gemma 4 GGUFs for the bf16 contract vs cuda f32")
    ap.add_argument("--real", nargs="*", default=[], help="checkpoints with trained weights: the absolute bf16 bound")
    a = ap.parse_args()
    b = Path(a.bin)
    rows, ok = [], True
    # The tests that read fixtures (the CUDA model's row-exact test) find them beside the first one
    # given; a skipped test fails the check.
    env = dict(os.environ)
    if a.fixtures:
        env["G4_FIXTURE_DIR"] = str(Path(a.fixtures[0]).resolve().parent)
    t = subprocess.run([str(b / "test_backend")], capture_output=True, text=True, env=env)
    print(t.stdout[-3000:])
    passed = t.returncode == 0 and "SKIPPED" not in t.stdout.split("[  PASSED  ]")[-1]
    rows.append(("test_backend", "ops vs reference", "pass" if passed else "FAIL"))
    ok &= passed
    for fx in a.fixtures:
        fx = Path(fx)
        if fx.name.endswith("-lora") or not (fx / "config.json").exists():  # adapters, drafters/, vision/
            continue
        with np.load(fx / "oracle.npz") as z:
            ids = [int(i) for i in z["prompt_ids"]]
            want = z["logits_f32"]
            greedy = [int(i) for i in z["greedy_f32"]]
        arg = ",".join(map(str, ids))
        with tempfile.TemporaryDirectory() as tmp:
            got = {}
            for be in ("cuda", "cpu"):
                run([b / "gemma4", "logits", "--model", fx, "--ids", arg, "--dtype", "f32", "--backend", be,
                     "--out", f"{tmp}/{be}.npy"])
                got[be] = np.load(f"{tmp}/{be}.npy")
        d_cuda = float(np.abs(got["cuda"] - want).max())
        d_cpu = float(np.abs(got["cpu"] - want).max())
        seq = json.loads(run([b / "gemma4", "greedy", "--model", fx, "--ids", arg, "--steps", len(greedy),
                              "--dtype", "f32", "--backend", "cuda"]).strip().splitlines()[-1])
        good = d_cuda <= LOGIT_TOL and seq == greedy
        ok &= good
        rows.append((fx.name, f"max|d| cuda {d_cuda:.2e} (cpu {d_cpu:.2e}), greedy {'same' if seq == greedy else 'DIFF'}",
                     "pass" if good else "FAIL"))
        kvq = fx / "kvquant.npz"
        if kvq.exists():
            with np.load(kvq) as z, tempfile.TemporaryDirectory() as tmp:
                for case in sorted({k[: -len("_ids")] for k in z.files if k.endswith("_ids")}):
                    bits, group, start, chunk = (int(x) for x in re.fullmatch(r"b(\d+)g(\d+)s(\d+)c(\d+)", case).groups())
                    run([b / "gemma4", "logits", "--model", fx, "--ids", ",".join(map(str, z[case + "_ids"])),
                         "--dtype", "f32", "--backend", "cuda", "--chunk", chunk, "--kv-bits", bits,
                         "--kv-group-size", group, "--quantized-kv-start", start, "--out", f"{tmp}/q.npy"])
                    d = float(np.abs(np.load(f"{tmp}/q.npy") - z[case + "_f32"]).max())
                    tol = max(1e-3, 3 * float(z[case + "_sens_f32"]))
                    ok &= d <= tol
                    rows.append((f"{fx.name} kv {case}", f"max|d| cuda {d:.2e} (bound {tol:.1e})",
                                 "pass" if d <= tol else "FAIL"))
        lora = fx.parent / f"{fx.name}-lora"
        if (lora / "oracle.npz").exists():
            with np.load(lora / "oracle.npz") as z, tempfile.TemporaryDirectory() as tmp:
                run([b / "gemma4", "logits", "--model", fx, "--adapter-path", lora, "--ids",
                     ",".join(map(str, z["ids"])), "--dtype", "f32", "--backend", "cuda", "--chunk", 4,
                     "--out", f"{tmp}/l.npy"])
                d = float(np.abs(np.load(f"{tmp}/l.npy") - z["f32_chunk4"]).max())
            ok &= d <= LOGIT_TOL
            rows.append((f"{fx.name} lora", f"max|d| cuda {d:.2e}", "pass" if d <= LOGIT_TOL else "FAIL"))
        for dr in sorted((fx.parent / "drafters").glob(f"{fx.name}-drafter*")):
            with np.load(dr / "oracle.npz") as z, tempfile.TemporaryDirectory() as tmp:
                out = run([b / "gemma4", "draft", "--model", fx, "--draft-model", dr, "--ids",
                           ",".join(map(str, z["ids"])), "--from", int(z["first"]), "--dtype", "f32", "--backend",
                           "cuda", "--logits-out", f"{tmp}/l.npy"])
                drafts = np.array([json.loads(line)["drafts"] for line in out.splitlines()])
                d = float(np.abs(np.load(f"{tmp}/l.npy") - z["logits"]).max())
                gen = json.loads(run([b / "gemma4", "draft", "--model", fx, "--draft-model", dr, "--ids",
                                      ",".join(map(str, z["gen_prompt"])), "--generate", len(z["gen"]), "--dtype",
                                      "f32", "--backend", "cuda"]))
                rounds = (len(z["gen_rounds"]), *(int(x) for x in z["gen_rounds"].sum(axis=0)))
                good = (np.array_equal(drafts, z["drafts"]) and d <= 2e-3 and gen["tokens"] == z["gen"].tolist()
                        and (gen["rounds"], gen["drafted"], gen["accepted"]) == rounds)
                ok &= good
                rows.append((dr.name, f"drafts {'same' if np.array_equal(drafts, z['drafts']) else 'DIFF'}, max|d| "
                             f"{d:.2e}, rounds {gen['rounds']}/{gen['accepted']} acc (mlx-vlm {rounds[0]}/{rounds[2]})",
                             "pass" if good else "FAIL"))
    for case in a.vision:
        case = Path(case)
        with np.load(case / "oracle.npz") as z, tempfile.TemporaryDirectory() as tmp:
            run([b / "gemma4", "vision", "--model", case, "--image", case / "wide.png", "--max-soft-tokens", 70,
                 "--backend", "cuda", "--features-out", f"{tmp}/f.npy"])
            df = float(np.abs(np.load(f"{tmp}/f.npy") - z["wide_features"]).max())
            run([b / "gemma4", "logits", "--model", case, "--ids", ",".join(map(str, z["ids"])), "--image",
                 f"{case / 'wide.png'},{case / 'small.png'}", "--max-soft-tokens", 70, "--dtype", "f32",
                 "--backend", "cuda", "--out", f"{tmp}/l.npy"])
            dl = float(np.abs(np.load(f"{tmp}/l.npy") - z["logits"]).max())
        good = df <= 5e-4 and dl <= LOGIT_TOL
        ok &= good
        rows.append((f"vision/{case.name}", f"features max|d| {df:.2e}, image logits max|d| {dl:.2e}",
                     "pass" if good else "FAIL"))
    c_rows, c_ok = bf16_contract(b, a.fixtures, a.gguf)
    rows += c_rows
    ok &= c_ok
    for m in map(Path, a.real):
        r_rows, r_ok = bf16_real(b, m)
        rows += r_rows
        ok &= r_ok
    print(f"{'check':24s} {'result':60s} verdict")
    for r in rows:
        print(f"{r[0]:24s} {r[1]:60s} {r[2]}")
    sys.exit(0 if ok else 1)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(ref, got):
    """(top-1 agreements, positions, mean KL(ref || got)) over the rows of two [L, V] logit arrays."""
    lr, lg = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(axis=-1)
    return int((ref.argmax(-1) == got.argmax(-1)).sum()), ref.shape[0], float(kl.mean())


# The two ways the contract's logits are computed on CUDA: the whole prompt in one forward (the
# prefill matmuls, on the tensor cores), and one token per forward (--chunk 1: the decode GEMVs,
# with bf16 activations the int8 dots of cuda_gemv_q8.cu, which greedy decoding runs).
CONTRACT_PATHS = (("prefill", []), ("decode", ["--chunk", "1"]))


def contract_logits(b, model, ids, acc):
    """The exact f32 reference's logits of the prompt ids against cuda bf16's on each CONTRACT_PATHS
    path: [(path, top-1 agreements, positions, mean KL)], each also added to acc[path] ([agreements,
    positions, KLs])."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        run([b / "gemma4", "logits", "--model", model, "--ids", ids, "--dtype", "f32", "--backend", "reference",
             "--out", f"{tmp}/ref.npy"])
        for path, extra in CONTRACT_PATHS:
            run([b / "gemma4", "logits", "--model", model, "--ids", ids, "--dtype", "bf16", "--backend", "cuda",
                 *extra, "--out", f"{tmp}/{path}.npy"])
            a1, n, kl = compare(np.load(f"{tmp}/ref.npy"), np.load(f"{tmp}/{path}.npy"))
            acc[path][0] += a1
            acc[path][1] += n
            acc[path][2].append(kl)
            out.append((path, a1, n, kl))
    return out


def greedy_pair(b, model, ids):
    """16 greedy ids after the prompt ids: (the exact f32 reference's, cuda bf16's)."""
    return [json.loads(run([b / "gemma4", "greedy", "--model", model, "--ids", ids, "--steps", 16, "--dtype", dt,
                            "--backend", be]).strip().splitlines()[-1])
            for be, dt in (("reference", "f32"), ("cuda", "bf16"))]


def bf16_contract(b, fixtures, ggufs):
    """Item 7 of the docstring, on both paths: rows for the summary table and whether every bound holds.

    Two bounds are reported. The issue's absolute one (top-1 >= 99 %, mean KL <= 1e-3, greedy16 on
    >= 90 % of fixtures) is printed as information: on these tiny random-weight fixtures no bf16
    engine meets it (mlx-lm's own bf16 run lies 10-100x farther from its f32 run). The verdict is
    the oracle-relative bound: on every fixture, each CUDA path is no farther from the exact f32
    reference than mlx-lm's own bf16 logits are from mlx-lm's f32 logits (KL no larger, top-1
    agreement no lower); on a synthetic GGUF (no oracle), cuda bf16 against cuda f32 is no farther
    than the cpu backend's bf16 rounding mode (MLX's) against the cpu f32 path."""
    rows, ok = [], True
    acc = {p: [0, 0, []] for p, _ in CONTRACT_PATHS}  # path -> [top-1 agreements, positions, KLs]
    greedy_same, greedy_n = 0, 0
    for fx in map(Path, fixtures):
        if fx.name.endswith("-lora") or not (fx / "config.json").exists():
            continue
        with np.load(fx / "oracle.npz") as z:
            arg = ",".join(str(int(i)) for i in z["prompt_ids"])
            oracle = compare(z["logits_f32"], z["logits_bf16"]) if "logits_bf16" in z.files else None
        notes, good = [], True
        for path, a1, n, kl in contract_logits(b, fx, arg, acc):
            notes.append(f"{path} {a1}/{n} KL {kl:.1e}")
            if oracle:
                good &= kl <= max(oracle[2], 1e-3) and a1 >= min(oracle[0], 0.99 * n)
        seqs = greedy_pair(b, fx, arg)
        greedy_n += 1
        greedy_same += seqs[0] == seqs[1]
        if oracle:
            notes.append(f"mlx-lm bf16 {oracle[0]}/{oracle[1]} KL {oracle[2]:.1e}")
            ok &= good
        rows.append((f"{fx.name} bf16", ", ".join(notes) + f", greedy16 {'same' if seqs[0] == seqs[1] else 'DIFF'}",
                     ("pass" if good else "FAIL") if oracle else "info"))
    if greedy_n:
        gfrac = greedy_same / greedy_n
        for path, _ in CONTRACT_PATHS:
            agree, total, kls = acc[path]
            top1, mkl = agree / total, float(np.mean(kls))
            met = top1 >= 0.99 and mkl <= 1e-3 and gfrac >= 0.9
            rows.append((f"absolute bound {path}", f"top-1 {100 * top1:.2f}% (>=99), mean KL {mkl:.2e} (<=1e-3), "
                         f"greedy16 same {greedy_same}/{greedy_n} (>=90%)", "met" if met else "info: not met"))
    for g in map(Path, ggufs):
        ids = ",".join(str(2 + (i * 7919) % 4000) for i in range(64))
        with tempfile.TemporaryDirectory() as tmp:
            for be, dt in (("cpu", "f32"), ("cpu", "bf16")):
                run([b / "gemma4", "logits", "--model", g, "--ids", ids, "--dtype", dt, "--backend", be,
                     "--out", f"{tmp}/{be}-{dt}.npy"])
            host = compare(np.load(f"{tmp}/cpu-f32.npy"), np.load(f"{tmp}/cpu-bf16.npy"))
            run([b / "gemma4", "logits", "--model", g, "--ids", ids, "--dtype", "f32", "--backend", "cuda",
                 "--out", f"{tmp}/f32.npy"])
            for path, extra in CONTRACT_PATHS:
                run([b / "gemma4", "logits", "--model", g, "--ids", ids, "--dtype", "bf16", "--backend", "cuda",
                     *extra, "--out", f"{tmp}/bf16.npy"])
                a1, n, kl = compare(np.load(f"{tmp}/f32.npy"), np.load(f"{tmp}/bf16.npy"))
                good = kl <= max(host[2], 1e-3)
                ok &= good
                rows.append((f"{g.stem} {path}", f"bf16 vs f32: top-1 {a1}/{n}, KL {kl:.2e} (cpu bf16 mode: "
                             f"{host[0]}/{host[1]}, KL {host[2]:.2e})", "pass" if good else "FAIL"))
        seqs = [json.loads(run([b / "gemma4", "greedy", "--model", g, "--ids", ids, "--steps", 16, "--dtype", dt,
                                "--backend", "cuda"]).strip().splitlines()[-1]) for dt in ("f32", "bf16")]
        rows.append((f"{g.stem} greedy16", f"bf16 vs f32 {'same' if seqs[0] == seqs[1] else 'DIFF'}", "info"))
    return rows, ok


# Natural text for the trained-weight check: prose, code, a list, dialogue, numbers, another language.
REAL_PROMPTS = (
    "The river had risen overnight, and by morning the old stone bridge was half under water. Farmers "
    "gathered on the hill above the village, watching the current carry branches, fence posts and once "
    "a whole hay cart downstream, while the children counted what floated past.",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out = []\n"
    "    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n",
    "Ingredients for the bread: 500 g flour, 350 ml warm water, 10 g salt and 7 g dried yeast. Mix the "
    "flour and the yeast, add the water slowly, knead for ten minutes and leave the dough to rise for an hour.",
    "Q: Why is the sky blue?\nA: Sunlight is scattered by the molecules of the air, and shorter (blue) "
    "wavelengths are scattered much more strongly than longer (red) ones, so blue light reaches our eyes "
    "from every direction of the sky.\nQ: And why are sunsets red?\nA:",
    "In 1969 the Apollo 11 mission landed two astronauts on the Moon. Neil Armstrong stepped onto the "
    "surface on July 20, followed by Buzz Aldrin, while Michael Collins stayed in lunar orbit aboard the "
    "command module Columbia.",
    "La ciudad despertaba despacio: los panaderos encendían los hornos, los primeros autobuses cruzaban "
    "la plaza vacía y, desde el mercado, llegaba el olor a café recién hecho y a naranjas.",
    "The table below lists the planets by their distance from the Sun: Mercury, Venus, Earth, Mars, "
    "Jupiter, Saturn, Uranus and Neptune. The four inner planets are rocky; the four outer ones are giants.",
    "Dear Ms. Keller,\n\nThank you for your letter of March 3. I am pleased to confirm that the meeting "
    "will take place on Thursday at ten o'clock in the small conference room on the second floor.",
)


def bf16_real(b, model):
    """The issue's absolute bf16 bound on a checkpoint with trained weights: over REAL_PROMPTS, cuda bf16
    (the whole prompt in one forward, and token by token) against the exact f32 reference backend: top-1
    agreement >= 99 % of positions and mean KL <= 1e-3 on each path, and 16-step greedy identical on
    >= 90 % of the prompts."""
    toks = run([b / "gemma4", "tokenize", "--model", model, "--bos", "--jsonl", "-"],
               input="\n".join(json.dumps(t) for t in REAL_PROMPTS) + "\n")
    prompts = [",".join(str(int(i)) for i in json.loads(line)) for line in toks.strip().splitlines()]
    acc = {p: [0, 0, []] for p, _ in CONTRACT_PATHS}
    same = 0
    for ids in prompts:
        contract_logits(b, model, ids, acc)
        seqs = greedy_pair(b, model, ids)
        same += seqs[0] == seqs[1]
    rows, ok = [], True
    for path, _ in CONTRACT_PATHS:
        agree, total, kls = acc[path]
        top1, mkl, worst = agree / total, float(np.mean(kls)), float(np.max(kls))
        met = top1 >= 0.99 and mkl <= 1e-3 and same >= 0.9 * len(prompts)
        ok &= met
        rows.append((f"{model.name} real {path}", f"top-1 {agree}/{total} ({100 * top1:.2f}%), mean KL {mkl:.2e} "
                     f"(worst prompt {worst:.2e}), greedy16 same {same}/{len(prompts)}", "pass" if met else "FAIL"))
    return rows, ok


if __name__ == "__main__":
    main()
