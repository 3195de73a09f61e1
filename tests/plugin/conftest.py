"""One real stack (the scheduler-core with the demo state, the Airflow API server with the
plugin) and one headless Chromium logged in through Airflow's own login page, for all of
this folder: starting them is most of its time. One test process runs the whole folder
(the root conftest's scheduler), so they start once, and they stop when the folder is done
rather than at the end of the whole run."""

from __future__ import annotations

import pytest

from tests.plugin.browser import Browser, chromium_path
from tests.plugin.stack import USERS, DemoScheduler, Stack


@pytest.fixture(scope="package")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-stack")
    s = Stack(tmp, DemoScheduler(tmp))
    yield s
    s.stop()


@pytest.fixture(scope="package")
def browser(stack):
    if chromium_path() is None:
        pytest.fail("no chromium: run scripts/ensure-chromium.sh (make test does)")
    b = Browser()
    try:
        login(b, stack.url, "viewer")
        yield b
    finally:
        b.close()


def login(b: Browser, url: str, user: str) -> None:
    """Airflow's login page, typed into like a person would."""
    b.open(f"{url}/")
    b.wait("document.querySelector('input[name=username]')", what="the login form")
    for field, value in (("username", user), ("password", USERS[user])):
        b.eval(f"document.querySelector('input[name={field}]').focus()")
        b.send("Input.insertText", text=value)
    b.eval("document.querySelector('button[type=submit]').click()")
    b.wait("!location.pathname.startsWith('/auth') && document.cookie.includes('_token=')",
           what="the login to finish")
