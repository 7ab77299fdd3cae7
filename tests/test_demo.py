"""The Gradio demo as a person uses it: the CPU server, the demo in its own process, a real headless Chromium.

Type text, pick a voice, set a length, click Speak: audio must start arriving before generation ends, the page's
``<audio>`` element must get a playable source with a duration, and the download must be the same audio. Then the two
errors a person meets first: empty text, a request the server refuses, and a server that is not running. A screenshot
of the finished page is written to ``docs/img/demo.png`` (the README shows it).

The browser is Debian's ``chromium`` driven by Playwright through ``executable_path``; ``scripts/ci_browser.sh``
installs it (the test calls it when the browser is missing, and skips only when that cannot install it).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.conftest import REPO_ROOT
from tests.server_utils import free_port

pytestmark = [pytest.mark.server, pytest.mark.engine]

DEMO = REPO_ROOT / "examples" / "online_serving" / "text_to_speech" / "kani_tts" / "gradio_demo.py"
SCREENSHOT = REPO_ROOT / "docs" / "img" / "demo.png"
CHROMIUM = Path(os.environ.get("KANI_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEPLOY = "kani_tts_cpu.yaml"  # the same server as tests/test_serving.py and tests/test_clients.py
# 15 codec chunks, ~2 s of generation on 2 cores.
FRAMES = 240
SAMPLES_PER_FRAME = 1764
# The page's downloads are throttled to this while it speaks, so the 847 KB of PCM take ~4 s to reach it. Whether a
# stream reaches the page in one read or in several is Chromium's and the CPU's business: on CI's 2 cores the page
# once got a 3.9-s stream (server's first chunk at 103 ms) as one read, and once a 40-frame one. Paced delivery
# makes the page's incremental playback observable on any machine; the demo's own first-audio time and total (its
# status line) show that the server's stream reached the demo before it ended.
PAGE_DOWNLOAD_BYTES_PER_S = 200_000
TEXT = "Hello from the browser. This sentence is spoken while it is generated."


@pytest.fixture(scope="module")
def server(omni_server, tiny_parallel):
    """The CPU server, reniced so that on a 2-core box its busy workers cannot starve the browser: once Chromium got
    no CPU for the whole 3.9 s of a 16-chunk stream and read it all at once. Every process and thread of the
    server's process group gets nice 10 (for the rest of the session: raising a priority back needs privileges)."""
    served = omni_server(tiny_parallel, DEPLOY)
    os.setpriority(os.PRIO_PGRP, served.proc.pid, max(10, os.getpriority(os.PRIO_PGRP, served.proc.pid)))
    return served


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """A headless Debian Chromium under Playwright; installs it with scripts/ci_browser.sh when it is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is in the dev extra: bash scripts/setup.sh"
    )
    if not CHROMIUM.exists():
        install = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / "ci_browser.sh")], capture_output=True, text=True, timeout=900
        )
        if not CHROMIUM.exists():
            pytest.skip(
                f"no browser at {CHROMIUM}, and scripts/ci_browser.sh could not install one "
                f"(exit {install.returncode}: {install.stderr.strip()[-300:]})"
            )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def demo_process(api_base: str, log_path: Path) -> Iterator[str]:
    """Run ``gradio_demo.py`` as its README says, on a free local port; yields the page URL."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(DEMO), "--api-base", api_base, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"demo exited with {proc.returncode}:\n{log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"demo not up after 120 s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def demo_url(server, tmp_path_factory) -> Iterator[str]:
    with demo_process(server.base_url, tmp_path_factory.mktemp("demo") / "demo.log") as url:
        yield url


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def open_demo(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#kani-speak")
    # The voice list is fetched from the server when the page loads.
    wait_for_status(page, "Connected|Error")


def wait_for_status(page, pattern: str, timeout: float | None = None) -> None:
    """Wait until the status box's text matches the JS regex ``pattern``.

    Gradio may render or re-render the box after the page's first controls, so the wait tolerates its absence.
    """
    page.wait_for_function(
        "(pattern) => { const e = document.querySelector('#kani-status');"
        " return e !== null && new RegExp(pattern).test(e.innerText); }",
        arg=pattern,
        timeout=timeout,
    )


def pick_voice(page, name: str) -> list[str]:
    """Open the voice dropdown, return its options, choose ``name``."""
    page.click("#kani-voice input")
    options = page.locator("[role=option]")
    options.first.wait_for()
    names = [text.split("\n")[-1].strip() for text in options.all_inner_texts()]
    options.filter(has_text=name).first.click()
    return names


def status_text(page) -> str:
    return page.inner_text("#kani-status")


def throttle_downloads(page, bytes_per_s: int) -> None:
    """Pace what the page downloads from now on, the way DevTools' network throttling does."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": bytes_per_s, "uploadThroughput": -1},
    )


def test_speak_streams_into_the_page_and_offers_the_result_for_download(server, demo_url, page, tmp_path):
    open_demo(page, demo_url)
    voices = httpx.get(f"{server.base_url}/v1/audio/voices").json()["voices"]
    assert pick_voice(page, "katie") == voices
    page.fill("#kani-text textarea", TEXT)
    page.fill("#kani-max-new-tokens input", str(FRAMES))
    # Greedy: the factory model then never ends early, so the length is exact.
    page.fill("#kani-temperature input[type=number]", "0")
    page.press("#kani-temperature input[type=number]", "Enter")
    throttle_downloads(page, PAGE_DOWNLOAD_BYTES_PER_S)
    page.click("#kani-speak")

    page.wait_for_function("() => window.kaniLast && window.kaniLast.doneMs !== null", timeout=180_000)
    played = page.evaluate("() => window.kaniLast")
    assert played["error"] is None, played
    assert played["samples"] == FRAMES * SAMPLES_PER_FRAME
    # Playback started with the first bytes, while the rest was still arriving.
    assert played["chunks"] >= 2, played
    assert played["arrivalsMs"][0] < played["arrivalsMs"][-1] <= played["doneMs"]

    # The player's <audio> gets the streamed audio as a playable WAV with a real duration.
    page.wait_for_function(
        "() => { const a = document.querySelector('#kani-live-audio');"
        " return a !== null && a.src.startsWith('blob:') && a.readyState >= 1 && a.duration > 0; }"
    )
    audio = page.evaluate(
        "() => { const a = document.querySelector('#kani-live-audio');"
        " return {duration: a.duration, error: a.error && a.error.code, wav: a.canPlayType('audio/wav')}; }"
    )
    assert audio["error"] is None and audio["wav"] in ("maybe", "probably")
    assert audio["duration"] == pytest.approx(FRAMES * SAMPLES_PER_FRAME / 22050, abs=0.01)

    wait_for_status(page, "Done")
    status = status_text(page)
    seconds = FRAMES * SAMPLES_PER_FRAME / 22050
    assert f"{seconds:.2f} s of audio" in status
    # The demo got the server's first audio well before its stream ended (the demo's own clock, not the page's).
    relayed = re.search(r"first audio after (\d+) ms, RTF ([\d.]+)", status)
    assert relayed, status
    first_ms, total_ms = int(relayed[1]), float(relayed[2]) * seconds * 1000
    assert first_ms < total_ms / 2, status
    download_button = page.locator("#kani-download")
    download_button.wait_for(state="visible")
    with page.expect_download() as info:
        download_button.click()
    saved = tmp_path / "download.wav"
    info.value.save_as(saved)
    data, rate = sf.read(saved, dtype="int16")
    assert rate == 22050 and len(data) == FRAMES * SAMPLES_PER_FRAME

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_empty_text_and_a_refused_request_are_shown_as_errors(demo_url, page):
    open_demo(page, demo_url)
    page.fill("#kani-text textarea", "   ")
    page.click("#kani-speak")
    page.wait_for_function("() => document.querySelector('.kani-status-error') !== null")
    assert "Type some text to speak first" in status_text(page)

    # The server refuses the request (over the model's limit): its own message reaches the person.
    page.fill("#kani-text textarea", TEXT)
    page.fill("#kani-max-new-tokens input", "100000")
    page.click("#kani-speak")
    wait_for_status(page, "max_new_tokens", timeout=60_000)
    message = status_text(page)
    assert "Error" in message and "exceeds this model's limit" in message and "HTTP 400" in message
    assert "max_new_tokens" in page.inner_text("#kani-live-status")


def test_a_server_that_is_down_is_named_with_what_to_do(browser, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with demo_process(dead, tmp_path / "demo-down.log") as url:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(60_000)
        open_demo(page, url)
        assert f"Cannot reach the Kani TTS server at {dead}" in status_text(page)
        assert "run_server.sh" in status_text(page)
        page.click("#kani-speak")
        # Speak checks the server first and says so in a toast as well as in the status box.
        toast = page.locator("[data-testid=toast-body]").filter(has_text="Cannot reach the Kani TTS server")
        toast.first.wait_for()
        assert "Cannot reach" in status_text(page)
        assert page.evaluate("() => window.kaniLast === undefined")  # nothing was streamed
        context.close()
