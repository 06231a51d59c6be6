"""Drives the gateway's web chat page in headless Chromium (Playwright, system browser).

Usage: python webchat.py PAGE_URL SESSION_KEY MESSAGE SCREENSHOT_PATH
Types MESSAGE, waits for streamed assistant text, a finished tool call and the run's end, saves a
screenshot and prints one JSON line with what the page showed.
"""
import json
import shutil
import sys

from playwright.sync_api import sync_playwright


def main() -> None:
    url, session, message, screenshot = sys.argv[1:5]
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-connected=true]", timeout=45000)
        page.fill("#session", session)
        page.dispatch_event("#session", "change")
        page.fill("#input", message)
        page.click("#send")
        # Text arrives in pieces while the run is still going (streamed, not one block).
        page.wait_for_function(
            "() => { const b = document.querySelector('.msg.assistant');"
            " return b && b.textContent.length > 0 && !document.querySelector('[data-status]'); }",
            timeout=45000,
        )
        partial = page.text_content(".msg.assistant")
        page.wait_for_selector(".tool.done", timeout=45000)
        page.wait_for_selector(".run-status[data-status=ok]", timeout=45000)
        page.screenshot(path=screenshot, full_page=True)
        print(json.dumps({
            "partial": partial,
            "assistant": " ".join(page.locator(".msg.assistant").all_text_contents()),
            "tools": page.locator(".tool").all_text_contents(),
            "status": page.text_content(".run-status[data-status]"),
        }))
        browser.close()


if __name__ == "__main__":
    main()
