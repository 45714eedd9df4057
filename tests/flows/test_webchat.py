"""`tuneline webchat`: Debian's chromium, driven by Playwright, types into the served page, and the
replies it shows, turn after turn, are the API's answers to the same conversation, each shown growing
piece by piece as it streams in.

Playwright's own browser download does not work here, so the test launches /usr/bin/chromium
(`apt-get install chromium`; .ci/run installs it). Without it the test is skipped, and fails when
TUNELINE_REQUIRE_ASSETS=1 (CI).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import missing_asset, stop_process
from serving_server import inference_yaml, start_server

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SYSTEM = "Answer in one word."
REPLY_TOKENS = 32  # several words of the random tiny model, so that a reply streams in several pieces
# Each reply's text at every moment the page changed it. A MutationObserver runs once for all the
# changes the page made in one go, so a reply whose chunks all came at once is seen once, whole.
RECORD_REPLY_TEXTS = """() => {
  window.replyTexts = [];
  const history = document.getElementById("history");
  new MutationObserver(() => {
    history.querySelectorAll(".assistant").forEach((reply, turn) => {
      const seen = window.replyTexts[turn] || (window.replyTexts[turn] = []);
      if (reply.textContent && reply.textContent !== seen[seen.length - 1]) seen.push(reply.textContent);
    });
  }).observe(history, {childList: true, subtree: true, characterData: true});
}"""


def require_chromium() -> None:
    if not CHROMIUM.is_file():
        missing_asset(f"Debian's chromium is not installed at {CHROMIUM}: apt-get install -y --no-install-recommends chromium")


@pytest.fixture(scope="module")
def starting(tiny_base: Path, tmp_path_factory):
    """The server, loading its model while the test starts the browser."""
    require_chromium()
    folder = tmp_path_factory.mktemp("webchat")
    config = inference_yaml(tiny_base, folder, max_new_tokens=REPLY_TOKENS)
    started = start_server("webchat", str(config), folder=folder, env={"API_KEY": ""})
    try:
        yield started
    finally:
        stop_process(started.process)


def api_answer(url: str, messages: list[dict]) -> str:
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_page_streams_replies_equal_to_the_api_answers_and_keeps_the_history(starting):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            server = starting.wait()
            page.goto(f"{server.url}/")
            page.evaluate(RECORD_REPLY_TEXTS)
            page.click("summary")  # the settings: the optional system prompt
            page.fill("#system", SYSTEM)
            shown = []
            for message in ("Hello", "What is 2 plus 2?"):
                page.fill("#message", message)
                page.click("#send")
                reply = page.locator(".assistant").nth(len(shown))
                reply.and_(page.locator("[data-done='true']")).wait_for(timeout=60_000)
                shown.append(reply.text_content())
            pieces = page.evaluate("window.replyTexts")
        finally:
            browser.close()
    first = api_answer(server.url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}])
    second = api_answer(server.url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"},
                                     {"role": "assistant", "content": first}, {"role": "user", "content": "What is 2 plus 2?"}])
    assert shown == [first, second] and first.strip() and second.strip()
    for texts, reply in zip(pieces, shown, strict=True):  # streamed: seen growing, at more than one moment
        assert len(texts) > 1 and texts[-1] == reply, texts
        assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:])), texts
