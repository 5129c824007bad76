"""Speculative decoding with the Gemma 4 assistant (MTP) drafter (--draft-model), against mlx-vlm.

tools/make_mtp_oracle.py builds drafters with mlx-vlm 0.7.10's own Gemma4AssistantDraftModel
(seeded random weights; one with ordered embeddings, i.e. centroid-routed heads; one "copy"
drafter whose proposals the fixtures' repetitive greedy text often accepts) for fixture targets,
and records (a) the drafter's K drafts, tied-head logits and states from every state of a token
sequence and (b) greedy speculative decoding: tokens and (drafted, accepted) per round.

Checks (f32): drafts identical and logits / states within DRAFT_TOL of mlx-vlm (measured: 6.3e-4
for the random drafters, whose inputs carry the target's own ~2e-4 differences, and 2.4e-5 for the
copy drafter), on the reference and cpu backends; the engine's speculative greedy output equals
mlx-vlm's round by round and equals `gemma4 greedy`; sampled output with a seed equals the same
run without the drafter; broken drafters are refused with one line naming the file and field.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run_oracle_script

DRAFTERS = [("dense-q4g64", "dense-q4g64-drafter"), ("estyle-q4g64", "estyle-q4g64-drafter"),
            ("dense-q4g64", "dense-q4g64-drafter-copy")]
# The drafter reads the target's own KV and hidden state, so the target's f32 differences feed it:
# 6e-4 with AVX-512's 16-wide sums, 2.0e-3 with 8-wide AVX2 ones (CPUs without AVX-512).
DRAFT_TOL = 3e-3


@pytest.fixture(scope="session")
def mtp_fixtures(parity_fixtures, repo_root):
    run_oracle_script(repo_root, parity_fixtures, "make_mtp_oracle.py")
    return parity_fixtures


def _run(bin_, *args, ok=True):
    r = subprocess.run([str(bin_), *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}\n{r.stderr[-2000:]}"
    return r


def _ids(a):
    return ",".join(str(int(x)) for x in a)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("target,drafter", DRAFTERS)
def test_drafts_match_mlx_vlm(gemma4_bin, mtp_fixtures, parity_report, tmp_path, target, drafter, backend):
    z = np.load(mtp_fixtures / "drafters" / drafter / "oracle.npz")
    r = _run(gemma4_bin, "draft", "--model", mtp_fixtures / target, "--draft-model", mtp_fixtures / "drafters" / drafter,
             "--ids", _ids(z["ids"]), "--from", int(z["first"]), "--dtype", "f32", "--backend", backend,
             "--logits-out", tmp_path / "l.npy", "--states-out", tmp_path / "s.npy")
    got = np.array([json.loads(line)["drafts"] for line in r.stdout.splitlines()])
    assert got.shape == z["drafts"].shape
    dl = float(np.abs(np.load(tmp_path / "l.npy") - z["logits"]).max())
    ds = float(np.abs(np.load(tmp_path / "s.npy") - z["states"]).max())
    same = int((got == z["drafts"]).sum())
    parity_report.append({"fixture": drafter, "check": f"mtp drafts {backend}", "ok": same == got.size,
                          "maxdiff": f"logits {dl:.2e} states {ds:.2e}"})
    assert same == got.size, f"{drafter}: {got.size - same} of {got.size} drafts differ"
    # Without --logits-out an ordered-embeddings head scores only the routed candidates' rows on
    # host backends: the same drafts.
    r2 = _run(gemma4_bin, "draft", "--model", mtp_fixtures / target, "--draft-model", mtp_fixtures / "drafters" / drafter,
              "--ids", _ids(z["ids"]), "--from", int(z["first"]), "--dtype", "f32", "--backend", backend)
    assert [json.loads(line)["drafts"] for line in r2.stdout.splitlines()] == got.tolist()
    assert dl <= DRAFT_TOL and ds <= DRAFT_TOL, f"{drafter}: logits {dl:.2e}, states {ds:.2e}"
    # The states differ from position to position far more than the tolerance: a drafter that
    # read the wrong position, window or hidden state would not pass.
    assert float(np.abs(np.diff(z["logits"], axis=0)).max()) > 100 * DRAFT_TOL


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("target,drafter", DRAFTERS)
def test_speculative_greedy_matches_rounds(gemma4_bin, mtp_fixtures, target, drafter, backend):
    z = np.load(mtp_fixtures / "drafters" / drafter / "oracle.npz")
    n = len(z["gen"])
    r = _run(gemma4_bin, "draft", "--model", mtp_fixtures / target, "--draft-model", mtp_fixtures / "drafters" / drafter,
             "--ids", _ids(z["gen_prompt"]), "--generate", n, "--dtype", "f32", "--backend", backend)
    j = json.loads(r.stdout)
    assert j["tokens"] == z["gen"].tolist()
    assert j["tokens"] == z["greedy"].tolist()
    drafted, accepted = (int(x) for x in z["gen_rounds"].sum(axis=0))
    assert (j["rounds"], j["drafted"], j["accepted"]) == (len(z["gen_rounds"]), drafted, accepted)
    assert 0 < j["decode_s"] < 60, j["decode_s"]  # first token to last (bench/cuda_speculative.sh reads it)
    plain = _run(gemma4_bin, "greedy", "--model", mtp_fixtures / target, "--ids", _ids(z["gen_prompt"]),
                 "--steps", n, "--dtype", "f32", "--backend", backend)
    assert json.loads(plain.stdout) == j["tokens"]
    if drafter.endswith("copy"):
        assert accepted >= 8, "the copy drafter should have drafts accepted"


@pytest.mark.parametrize("temperature,top_k", [(0.8, 0), (1.0, 20)])
def test_sampled_output_is_the_target_alone(gemma4_bin, mtp_fixtures, temperature, top_k):
    """Every emitted token is sampled from the target with the request's RNG, in order: the same
    seed gives the same tokens with and without the drafter."""
    target, drafter = "dense-q4g64", "dense-q4g64-drafter-copy"
    z = np.load(mtp_fixtures / "drafters" / drafter / "oracle.npz")
    base = ["draft", "--model", mtp_fixtures / target, "--draft-model", mtp_fixtures / "drafters" / drafter,
            "--ids", _ids(z["gen_prompt"]), "--generate", 40, "--dtype", "f32", "--temperature", temperature,
            "--top-k", top_k]
    for seed in (1, 2, 3):
        with_d = json.loads(_run(gemma4_bin, *base, "--seed", seed).stdout)
        without = json.loads(_run(gemma4_bin, *base, "--seed", seed, "--without-drafter").stdout)
        assert with_d["tokens"] == without["tokens"], f"seed {seed}"
        assert with_d["rounds"] > 0 and without["rounds"] == 0


def _broken(mtp_fixtures, tmp_path, edit):
    d = tmp_path / "broken"
    shutil.copytree(mtp_fixtures / "drafters" / "dense-q4g64-drafter", d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg, d)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("edit,message", [
    (lambda c, d: c.update(backbone_hidden_size=96), "backbone_hidden_size = 96 but the target"),
    (lambda c, d: c.update(model_type="gemma4_text"), "is not a Gemma 4 assistant drafter"),
    (lambda c, d: c["text_config"].update(sliding_window=16), "sliding window 16 but target layer"),
    (lambda c, d: c["text_config"].update(head_dim=16), "cannot read target layer"),
    (lambda c, d: c["text_config"].update(enable_moe_block=True), "MoE drafters are not supported"),
    (lambda c, d: c.pop("text_config"), "missing required object 'text_config'"),
    (lambda c, d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00"), "model.safetensors"),
])
def test_broken_drafter_is_refused(gemma4_bin, mtp_fixtures, tmp_path, edit, message):
    d = _broken(mtp_fixtures, tmp_path, edit)
    r = _run(gemma4_bin, "draft", "--model", mtp_fixtures / "dense-q4g64", "--draft-model", d, "--ids", "2,5,7",
             ok=False)
    assert r.returncode == 1
    err = r.stderr.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_draft_tokens_needs_a_drafter(gemma4_bin, mtp_fixtures):
    r = _run(gemma4_bin, "greedy", "--model", mtp_fixtures / "dense-q4g64", "--ids", "2,5", "--steps", 2,
             "--draft-tokens", 3, ok=False)
    assert r.returncode == 1 and "--draft-tokens needs --draft-model" in r.stderr
