"""`tuneline webchat`: Debian's chromium, driven by Playwright, types into the served page, and the
streamed replies it shows, turn after turn, are the API's answers to the same conversation.

Playwright's own browser download does not work here, so the test launches /usr/bin/chromium
(`apt-get install chromium`; .ci/run installs it). Without it the test is skipped, and fails when
TUNELINE_REQUIRE_ASSETS=1 (CI).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serving_server import inference_yaml, start_server

from conftest import missing_asset, stop_process

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SYSTEM = "Answer in one word."


def require_chromium() -> None:
    if not CHROMIUM.is_file():
        missing_asset(f"Debian's chromium is not installed at {CHROMIUM}: apt-get install -y --no-install-recommends chromium")


@pytest.fixture(scope="module")
def starting(tiny_base: Path, tmp_path_factory):
    """The server, loading its model while the test starts the browser."""
    require_chromium()
    folder = tmp_path_factory.mktemp("webchat")
    started = start_server("webchat", str(inference_yaml(tiny_base, folder)), folder=folder, env={"API_KEY": ""})
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
            page.click("summary")  # the settings: the optional system prompt
            page.fill("#system", SYSTEM)
            shown = []
            for message in ("Hello", "What is 2 plus 2?"):
                page.fill("#message", message)
                page.click("#send")
                reply = page.locator(".assistant").nth(len(shown))
                reply.and_(page.locator("[data-done='true']")).wait_for(timeout=60_000)
                shown.append(reply.text_content())
        finally:
            browser.close()
    first = api_answer(server.url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}])
    second = api_answer(server.url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"},
                                     {"role": "assistant", "content": first}, {"role": "user", "content": "What is 2 plus 2?"}])
    assert shown == [first, second] and first.strip() and second.strip()
