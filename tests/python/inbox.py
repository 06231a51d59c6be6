"""Watches the web chat's inbox in headless Chromium (Playwright, system browser).

Usage: python inbox.py PAGE_URL SCREENSHOT_PATH
Prints `ready` once the page is connected and its inbox subscribed, waits until a conversation
of the `cli` channel shows a reply, saves a screenshot and prints one JSON line with what the
inbox showed.
"""
import json
import shutil
import sys

from playwright.sync_api import sync_playwright


def main() -> None:
    url, screenshot = sys.argv[1:3]
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-connected=true]", timeout=45000)
        page.wait_for_selector("#inbox:not([hidden])", timeout=45000)
        print("ready", flush=True)
        page.wait_for_selector(
            "#conversations li[data-channel=cli][data-direction=out]", timeout=45000
        )
        page.screenshot(path=screenshot, full_page=True)
        items = page.eval_on_selector_all(
            "#conversations li",
            "els => els.map(e => ({channel: e.dataset.channel, session: e.dataset.session,"
            " direction: e.dataset.direction, last: e.querySelector('.last').textContent}))",
        )
        print(json.dumps({"items": items}))
        browser.close()


if __name__ == "__main__":
    main()
