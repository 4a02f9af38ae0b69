"""A real `relay web` on loopback for a test, and a headless chromium to drive it."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.redis_server import free_port
from tests.support.worker_process import RelayProcess

__all__ = ["CHROMIUM", "RelayWeb", "browser_page", "form_of", "screen"]

CHROMIUM = Path("/usr/bin/chromium")
USER = "alice"


class RelayWeb:
    """`relay web` on a free port, signed in as `alice`; `client` is an httpx client. With
    `app`, it runs that app (it knows its tools, to check edited arguments)."""

    def __init__(
        self, env: Mapping[str, str], log_path: Path, *, flower_url: str = "", app: str = ""
    ) -> None:
        self.port = free_port()
        self.user = USER
        self.password = f"web-{secrets.token_hex(8)}"
        web_env = {
            **env,
            "RELAY_WEB_USER": self.user,
            "RELAY_WEB_PASSWORD": self.password,
            "RELAY_FLOWER_URL": flower_url,
        }
        self.process = RelayProcess(
            [*(["--app", app] if app else []), "web", "--port", str(self.port)],
            web_env,
            log_path,
            ready_text="Uvicorn running on",
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, auth=(self.user, self.password), timeout=10)

    def __enter__(self) -> RelayWeb:
        self.process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()
        self.process.stop()


def form_of(html: str, run_id: str, what: str) -> dict[str, str]:
    """The hidden fields of the approval form for (`run_id`, `what`) in a page."""
    for form in re.findall(r'<form method="post" action="/approvals/decide".*?</form>', html, re.S):
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))
        if fields.get("run") == run_id and fields.get("what") == what:
            return {k: v for k, v in fields.items() if k != "decision"}
    raise AssertionError(f"no form for {what} of {run_id} in the page")


@contextmanager
def browser_page(web: RelayWeb) -> Iterator[object]:
    """A page of Debian's chromium, headless, signed in to `web` (skips if it is missing,
    fails instead under RELAY_TEST_REQUIRE_BROWSER=1, as CI sets it)."""
    if not CHROMIUM.exists():
        missing = "Debian's chromium is not installed (.ci/run installs it)"
        if os.environ.get("RELAY_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{missing}, and RELAY_TEST_REQUIRE_BROWSER=1 needs it")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - only the browser tests

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            context = browser.new_context(
                http_credentials={"username": web.user, "password": web.password},
                base_url=web.url,
            )
            yield context.new_page()
        finally:
            browser.close()


def screen(page: Any, name: str, *, whole: bool = True) -> None:
    """Save what `page` shows as DIR/`name`.png when RELAY_TEST_SCREENS=DIR is set (how the
    pictures in docs/screens/ are taken); nothing otherwise."""
    where = os.environ.get("RELAY_TEST_SCREENS")
    if where:
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=whole)
