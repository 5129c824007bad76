"""Image input (vision/): preprocessing against HF's Gemma4ImageProcessorPil, the vision encoder and
image-conditioned logits against mlx-vlm's own gemma4 model.

tools/make_vision_oracle.py builds four tiny image+text checkpoints with mlx-vlm 0.7.10's gemma4
Model (clipped linears as E2B/E4B and a standardizing encoder, both over an E-style causal text
model; and 26B/31B style: standardizing encoder, K=V text model attending bidirectionally within
each image) and its gemma4_unified Model (the 12B's encoder-free embedder, with mlx-vlm's own
processor for its 48-pixel patches), PNG images
that need down- and up-scaling, and records HF's pixel values and positions, mlx-vlm's pooled
encoder output and text-space features, and logits of a prompt holding two images.

Bounds (f32): pixel values identical (Pillow's bicubic resize is reproduced bit for bit); pooled
output within VISION_TOL (measured 4.6e-5), features within VISION_TOL (measured 8.6e-6), logits
within LOGIT_TOL (measured 9.5e-5; 3.6e-5 with bidirectional image blocks; 2.0e-4 for the unified
case, whose dense K=V text model sits near 1.6e-4 in f32 anyway), on the reference and cpu
backends, in one forward and in chunks of 7 tokens.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from conftest import run_oracle_script

CASES = ["clipped", "standardize", "bidi", "unified"]
IMAGES = ["wide", "tall", "small"]
VISION_TOL = 5e-4
LOGIT_TOL = 1e-3


@pytest.fixture(scope="session")
def vision_fixtures(parity_fixtures, repo_root):
    run_oracle_script(repo_root, parity_fixtures, "make_vision_oracle.py")
    return parity_fixtures / "vision"


def _run(bin_, *args, ok=True):
    r = subprocess.run([str(bin_), *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}\n{r.stderr[-2000:]}"
    return r


def _vision(bin_, model, image, tmp_path, budget=70, backend="cpu"):
    r = _run(bin_, "vision", "--model", model, "--image", image, "--max-soft-tokens", budget, "--backend", backend,
             "--pixels-out", tmp_path / "px.npy", "--positions-out", tmp_path / "pos.npy",
             "--pooled-out", tmp_path / "pool.npy", "--features-out", tmp_path / "ft.npy")
    info = json.loads(r.stdout)
    return info, {k: np.load(tmp_path / f"{k}.npy") for k in ("px", "pos", "pool", "ft")}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", CASES)
def test_encoder_matches_mlx_vlm(gemma4_bin, vision_fixtures, parity_report, tmp_path, case, backend):
    d = vision_fixtures / case
    z = np.load(d / "oracle.npz")
    for im in IMAGES:
        info, got = _vision(gemma4_bin, d, d / f"{im}.png", tmp_path, backend=backend)
        assert got["px"].shape == z[f"{im}_pixels"].shape
        assert np.array_equal(got["px"], z[f"{im}_pixels"]), f"{im}: pixels differ from HF's"
        assert np.array_equal(got["pos"].astype(np.int32), z[f"{im}_positions"])
        assert info["soft_tokens"] == z[f"{im}_features"].shape[0]
        dp = float(np.abs(got["pool"] - z[f"{im}_pooled"]).max())
        df = float(np.abs(got["ft"] - z[f"{im}_features"]).max())
        parity_report.append({"fixture": f"vision/{case}", "check": f"encoder {im} {backend}",
                              "ok": dp <= VISION_TOL and df <= VISION_TOL, "maxdiff": f"pooled {dp:.2e} features {df:.2e}"})
        assert dp <= VISION_TOL and df <= VISION_TOL, f"{im}: pooled {dp:.2e}, features {df:.2e}"


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", CASES)
def test_logits_with_images_match_mlx_vlm(gemma4_bin, vision_fixtures, parity_report, tmp_path, case, backend):
    d = vision_fixtures / case
    z = np.load(d / "oracle.npz")
    ids = ",".join(map(str, z["ids"]))
    base = ["logits", "--model", d, "--ids", ids, "--max-soft-tokens", 70, "--dtype", "f32", "--backend", backend,
            "--out", tmp_path / "l.npy"]
    for chunk in (None, 7):
        extra = ["--chunk", chunk] if chunk else []
        _run(gemma4_bin, *base, "--image", f"{d / 'wide.png'},{d / 'small.png'}", *extra)
        diff = float(np.abs(np.load(tmp_path / "l.npy") - z["logits"]).max())
        parity_report.append({"fixture": f"vision/{case}", "check": f"image logits {backend} chunk {chunk}",
                              "ok": diff <= LOGIT_TOL, "maxdiff": f"{diff:.2e}"})
        assert diff <= LOGIT_TOL, f"chunk {chunk}: max|Δlogit| {diff:.2e}"
    # The images matter: wide2.png (as many soft tokens, other content) in the first slot moves the
    # logits after it by far more than the bound, and ours follow.
    if "logits_wide2" not in z.files:  # (recorded for the encoder cases)
        return
    _run(gemma4_bin, *base, "--image", f"{d / 'wide2.png'},{d / 'small.png'}")
    diff2 = float(np.abs(np.load(tmp_path / "l.npy") - z["logits_wide2"]).max())
    moved = float(np.abs(z["logits_wide2"] - z["logits"]).max())
    assert diff2 <= LOGIT_TOL and moved > 100 * LOGIT_TOL, (diff2, moved)


def test_resize_matches_pillow_on_many_sizes(gemma4_bin, vision_fixtures, tmp_path):
    """Pillow's BICUBIC resize through HF's processor, reproduced exactly: random content, sizes
    that scale down by up to 10x, up by up to 6x, odd sizes and both budgets' rounding."""
    from PIL import Image
    from transformers.models.gemma4 import Gemma4ImageProcessorPil
    rng = np.random.default_rng(7)
    d = vision_fixtures / "clipped"
    for (h, w), budget in [((1000, 700), 70), ((33, 47), 70), ((480, 640), 140), ((97, 1021), 70), ((256, 256), 70),
                           ((150, 149), 140)]:
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        arr[: h // 2] = np.minimum(255, arr[: h // 2] // 4 + np.arange(w, dtype=np.uint8)[None, :, None] % 200)
        f = tmp_path / f"img{h}x{w}.png"
        Image.fromarray(arr).save(f)
        p = Gemma4ImageProcessorPil(max_soft_tokens=budget)(images=[Image.open(f)], return_tensors="np")
        n = int((p["image_position_ids"][0][:, 0] >= 0).sum())
        want = p["pixel_values"][0][:n]
        r = _run(gemma4_bin, "vision", "--model", d, "--image", f, "--max-soft-tokens", budget,
                 "--pixels-out", tmp_path / "px.npy", ok=False)
        if r.returncode != 0:  # the tiny position table (64) cannot hold very wide grids
            assert "the position table holds 64" in r.stderr
            continue
        got = np.load(tmp_path / "px.npy")
        assert got.shape == want.shape, (h, w)
        assert np.array_equal(got, want), f"{h}x{w}: max diff {np.abs(got - want).max()}"


def test_bad_images_are_refused(gemma4_bin, vision_fixtures, tmp_path):
    d = vision_fixtures / "clipped"
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    r = _run(gemma4_bin, "vision", "--model", d, "--image", junk, ok=False)
    assert r.returncode == 1 and "junk.png" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _run(gemma4_bin, "vision", "--model", d, "--image", d / "thin.png", "--max-soft-tokens", 70, ok=False)
    assert r.returncode == 1 and "the position table holds 64" in r.stderr
    r = _run(gemma4_bin, "vision", "--model", d, "--image", d / "wide.png", "--max-soft-tokens", 100, ok=False)
    assert r.returncode == 1 and "must be one of 70, 140, 280, 560, 1120" in r.stderr
    z = np.load(d / "oracle.npz")
    r = _run(gemma4_bin, "logits", "--model", d, "--ids", ",".join(map(str, z["ids"])), "--image", d / "wide.png",
             "--max-soft-tokens", 70, "--out", tmp_path / "l.npy", ok=False)
    assert r.returncode == 1 and "image tokens but the images give" in r.stderr


def test_chat_with_an_image_matches_mlx_vlm(gemma4_bin, vision_fixtures, tmp_path):
    """The chat path end to end on the tiny chat-capable fixture: the official template writes the
    image token, the engine expands it and encodes the image, and the greedy reply equals
    mlx-vlm's (ids through `greedy --image`, text through `run --image`)."""
    d = vision_fixtures / "clipped"
    z = np.load(d / "oracle.npz")
    r = _run(gemma4_bin, "greedy", "--model", d, "--ids", ",".join(map(str, z["chat_ids"])), "--image",
             d / "wide.png", "--max-soft-tokens", 70, "--steps", len(z["chat_greedy"]), "--dtype", "f32")
    assert json.loads(r.stdout) == z["chat_greedy"].tolist()
    from tokenizers import Tokenizer
    want = Tokenizer.from_file(str(d / "tokenizer.json")).decode(
        [t for t in z["chat_greedy"].tolist() if t not in (1, 504)], skip_special_tokens=False)
    r = _run(gemma4_bin, "run", "--model", d, "--image", d / "wide.png", "--max-tokens", len(z["chat_greedy"]),
             "--temp", "0", "--threads", 2, "What is in this picture?")
    assert r.stdout.rstrip("\n") == want
    assert f"prompt: {len(z['chat_ids'])} tokens" in r.stderr


class _Server:
    def __init__(self, binary, *args):
        import re
        self.proc = subprocess.Popen([str(binary), "serve", "--port", "0", "--threads", "2", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"ready: (http://[\d.]+:\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("server did not start: " + line + self.proc.stderr.read()[-2000:])
        self.url = m.group(1)

    def post(self, path, body):
        import urllib.request
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_server_accepts_images(gemma4_bin, vision_fixtures):
    """OpenAI image_url parts (base64 data: URLs) and Anthropic base64 image blocks reach the
    model: the replies equal `run --image`; bad images are 400s that name the part, and the server
    keeps serving."""
    import base64
    d = vision_fixtures / "clipped"
    z = np.load(d / "oracle.npz")
    n = len(z["chat_greedy"])
    b64 = base64.b64encode((d / "wide.png").read_bytes()).decode()
    want = _run(gemma4_bin, "run", "--model", d, "--image", d / "wide.png", "--max-tokens", n, "--temp", "0",
                "--threads", 2, "What is in this picture?").stdout.rstrip("\n")
    s = _Server(gemma4_bin, "--model", d)
    try:
        msg = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
            {"type": "text", "text": "What is in this picture?"}]}]
        st, r = s.post("/v1/chat/completions", {"model": "m", "messages": msg, "max_tokens": n, "temperature": 0})
        assert st == 200, r
        assert r["choices"][0]["message"]["content"] == want
        assert r["usage"]["prompt_tokens"] == len(z["chat_ids"])
        st, r = s.post("/v1/messages", {"model": "m", "max_tokens": n, "temperature": 0, "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
                {"type": "text", "text": "What is in this picture?"}]}]})
        assert st == 200, r
        assert "".join(b.get("text", "") for b in r["content"]) == want
        for url, needle in [("https://example.com/cat.png", "remote image URLs are not fetched"),
                            ("data:image/png;base64,@@@", "base64 payload is invalid"),
                            ("data:image/png;base64," + base64.b64encode(b"not an image").decode(),
                             "messages[0].content[0]")]:
            bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                {"type": "text", "text": "hi"}]}]
            st, r = s.post("/v1/chat/completions", {"model": "m", "messages": bad, "max_tokens": 2})
            assert st == 400 and needle in r["error"]["message"], (url, r)
        st, r = s.post("/v1/chat/completions", {"model": "m", "messages": msg, "max_tokens": n, "temperature": 0})
        assert st == 200 and r["choices"][0]["message"]["content"] == want
    finally:
        s.close()


def test_decoding_matches_pillow(gemma4_bin, vision_fixtures, tmp_path):
    """Pixels identical to HF's processor (Pillow decoding + convert("RGB")) for JPEG (baseline,
    progressive, 4:4:4 / 4:2:2 / 4:2:0 chroma, grey) through libjpeg-turbo, and for PNG in RGBA,
    palette and grey modes and GIF through stb_image."""
    from PIL import Image
    from transformers.models.gemma4 import Gemma4ImageProcessorPil
    d = vision_fixtures / "clipped"
    base = Image.open(d / "wide.png").convert("RGB")
    cases = []
    for q, sub, prog in [(95, 0, False), (75, 2, False), (50, 1, True)]:
        for mode in ("RGB", "L"):
            f = tmp_path / f"q{q}s{sub}{mode}.jpg"
            base.convert(mode).save(f, quality=q, subsampling=sub, progressive=prog)
            cases.append(f)
    rgba = base.convert("RGBA")
    rgba.putalpha(128)
    for name, im in [("rgba.png", rgba), ("pal.png", base.convert("P")), ("grey.png", base.convert("L")),
                     ("anim.gif", base.convert("P"))]:
        im.save(tmp_path / name)
        cases.append(tmp_path / name)
    proc = Gemma4ImageProcessorPil(max_soft_tokens=70)
    for f in cases:
        p = proc(images=[Image.open(f)], return_tensors="np")
        n = int((p["image_position_ids"][0][:, 0] >= 0).sum())
        _run(gemma4_bin, "vision", "--model", d, "--image", f, "--max-soft-tokens", 70, "--pixels-out", tmp_path / "px.npy")
        got = np.load(tmp_path / "px.npy")
        assert np.array_equal(got, p["pixel_values"][0][:n]), f"{f.name}: {np.abs(got - p['pixel_values'][0][:n]).max()}"


def test_bidirectional_image_blocks(gemma4_bin, vision_fixtures, tmp_path):
    """26B/31B style (use_bidirectional_attention = "vision"): each image's tokens see each other,
    on sliding layers too (the fixture's window, 8, is shorter than an image). mlx-vlm's overlay
    moves these logits by far more than the bound; ours follow it, also when the prompt is fed in
    chunks (a chunk never splits an image). Backends without image blocks refuse such prompts."""
    d = vision_fixtures / "bidi"
    z = np.load(d / "oracle.npz")
    assert float(np.abs(z["logits"] - z["logits_causal"]).max()) > 100 * LOGIT_TOL
    ids = ",".join(map(str, z["ids"]))
    r = _run(gemma4_bin, "logits", "--model", d, "--ids", ids, "--image", f"{d / 'wide.png'},{d / 'small.png'}",
             "--max-soft-tokens", 70, "--dtype", "f32", "--backend", "ggml", "--out", tmp_path / "l.npy", ok=False)
    # Refused either way: for the image blocks, or (CPUs without AVX-512) the ggml backend itself.
    assert r.returncode == 1 and ("not supported on the ggml backend yet" in r.stderr
                                  or "needs an x86-64 CPU with AVX-512" in r.stderr), r.stderr
    c = vision_fixtures / "clipped"  # run: the error is printed and the exit code says so
    r = _run(gemma4_bin, "run", "--model", c, "--image", tmp_path / "missing.png", "hi", ok=False)
    assert r.returncode == 1 and "missing.png: cannot open image" in r.stderr
    (tmp_path / "bad.png").write_bytes(b"not an image")
    r = _run(gemma4_bin, "run", "--model", c, "--image", tmp_path / "bad.png", "--max-tokens", 2, "hi", ok=False)
    assert r.returncode == 1 and "bad.png: not a decodable image" in r.stderr
