"""The API's /docs and /redoc render in a browser that can reach nothing but loopback:
their Swagger UI and ReDoc assets come from the installed package, not a CDN."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import yaml

from tests.plugin.browser import OFFLINE, Browser, chromium_path
from tests.servers import Server

pytestmark = pytest.mark.skipif(chromium_path() is None,
                                reason="no chromium (make test installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": [
        {"name": "dgx-1", "model": "dgx-a100"}]}))
    srv = Server(f"sqlite:///{tmp}/db.sqlite", cluster)
    yield srv
    srv.stop()


def test_the_docs_pages_name_no_host_but_their_own(server):
    for page in ("/docs", "/redoc"):
        html = httpx.get(server.url + page, timeout=10).text
        assert re.findall(r"https?://[^\s\"']+", html) == [], page


@pytest.mark.parametrize("page, ready", [
    ("/docs", "document.querySelectorAll('.opblock').length"),
    ("/redoc", "document.querySelectorAll('[data-section-id]').length"),
])
def test_the_docs_render_with_the_network_off(server, page, ready):
    b = Browser(flags=OFFLINE)
    try:
        b.open(server.url + page)
        assert b.wait(f"{ready} > 10", what=f"{page} rendered its operations")
        assert "/api/v1/jobs" in b.text()
        loaded = b.eval("JSON.stringify(performance.getEntriesByType('resource')"
                        ".map(e => e.name))")
        outside = [u for u in json.loads(loaded) if not u.startswith(server.url)]
        # ReDoc's bundle links its "powered by" logo from its CDN: an image, no more
        assert loaded != "[]" and outside in ([], ["https://cdn.redoc.ly/redoc/logo-mini.svg"])
        assert not outside or page == "/redoc"
    finally:
        b.close()
