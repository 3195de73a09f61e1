"""The compact cluster view on a 128-host cluster (1,024 GPUs) in headless Chromium,
against its own scheduler-core and Airflow API server: one cell per GPU grouped by rack
and switch, states as the scheduler's API gives them, filters and search in the URL that
survive the page's refresh, and a pending job's reservation."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.plugin.bigstack import BIG_DRAINED, BIG_UNHEALTHY, BIG_UNREACHABLE, BigScheduler
from tests.plugin.browser import Browser, chromium_path
from tests.plugin.conftest import login
from tests.plugin.stack import Stack

WIDTH, HEIGHT = 1280, 900


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-big")
    # the page of 1,024 GPUs refreshes every 3 s, not every second: redrawn in Chromium,
    # each refresh costs CPU the other test process needs
    s = Stack(tmp, BigScheduler(tmp / "scheduler"), conn_id="gpu_scheduler_big", refresh=3)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def b(big):
    if chromium_path() is None:
        pytest.fail("no chromium: run scripts/ensure-chromium.sh (make test does)")
    browser = Browser(WIDTH, HEIGHT)          # its own profile: its own Airflow login
    try:
        login(browser, big.url, "viewer")
        yield browser
    finally:
        browser.close()


def js(value) -> str:
    return json.dumps(value)


def attrs(b, selector: str, attr: str) -> list:
    return b.eval(f"[...document.querySelectorAll({js(selector)})]"
                  f".map(e => e.getAttribute({js(attr)}))")


def shown_hosts(b) -> list[str]:
    return attrs(b, "#main [data-host]", "data-host")


def expected_state(host: dict, g: dict) -> str:
    if not g.get("healthy", True):
        return "unhealthy"
    if g.get("job"):
        return "held"
    if host.get("reachable", True) is False:
        return "unreachable"
    return "drained" if host.get("drained") else "free"


def test_compact_view_shows_every_gpu_by_rack_and_switch(big, b):
    b.open(f"{big.url}/gpu/cluster")
    b.wait("document.querySelector('#compact [data-gpu]')", what="the compact view")
    cluster = big.scheduler.call("GET", "/api/v1/cluster")
    hosts = cluster["hosts"]
    assert len(hosts) == 128
    assert attrs(b, "[data-rack]", "data-rack") == [f"rack-{r:02d}" for r in range(1, 9)]
    assert attrs(b, "[data-switch]", "data-switch") == [f"leaf-{s:02d}" for s in range(1, 17)]
    assert shown_hosts(b) == [h["name"] for h in hosts]
    assert attrs(b, "[data-switch=leaf-03] [data-host]", "data-host") == \
        [f"dgx-{n:03d}" for n in range(17, 25)]
    # one cell per GPU, each in the state the scheduler gives it, held ones naming the job
    want = {f"{h['name']}:{g['index']}": (expected_state(h, g), g.get("job"))
            for h in hosts for g in h["gpus"]}
    got = b.eval("Object.fromEntries([...document.querySelectorAll('[data-gpu]')]"
                 ".map(e => [e.dataset.gpu, [e.dataset.state, e.dataset.job || null]]))")
    assert len(got) == len(want) == 1024
    assert got == {k: list(v) for k, v in want.items()}
    states = [s for s, _ in want.values()]
    assert 0 < states.count("held") < 1024 and states.count("free") > 0
    assert b.text("#gpus-free") == str(states.count("free"))
    for host, index, reason in BIG_UNHEALTHY:
        cell = f"[data-gpu={js(f'{host}:{index}')}]"
        assert reason in b.eval(f"document.querySelector({js(cell)}).title")
    for host, reason in BIG_DRAINED.items():
        assert b.eval(f"document.querySelector('[data-host={host}]').dataset.status") == \
            "drained"
        assert b.eval(f"document.querySelector('[data-host={host}]').title").endswith(
            f"drained: {reason}")
    assert b.eval(f"document.querySelector('[data-host={BIG_UNREACHABLE}]')"
                  ".dataset.status") == "unreachable"
    # a held cell links to its job's page
    held = next(k for k, (s, _) in want.items() if s == "held")
    href = b.eval(f"document.querySelector('[data-gpu={js(held)}]').getAttribute('href')")
    assert href.endswith(f"/jobs/{want[held][1]}")


def test_compact_view_stays_readable_at_128_hosts(big, b, tmp_path):
    """No sideways scrolling, every host on about two screens, where the full view of the
    same cluster needs many times that."""
    b.open(f"{big.url}/gpu/cluster")
    b.wait("document.querySelector('#compact [data-gpu]')")
    assert b.eval("document.documentElement.scrollWidth <= window.innerWidth")
    compact = b.eval("document.documentElement.scrollHeight")
    assert compact < 2.5 * HEIGHT, compact
    cell = b.eval("(r => [r.width, r.height])(document.querySelector('[data-gpu]')"
                  ".getBoundingClientRect())")
    assert cell[0] >= 8 and cell[1] >= 8            # big enough to see and to point at
    b.screenshot(tmp_path / "compact.png", full_page=True)
    assert (tmp_path / "compact.png").stat().st_size > 10_000
    b.open(f"{big.url}/gpu/cluster?view=full")
    b.wait("document.querySelector('#main .host')")
    assert b.eval("document.documentElement.scrollHeight") > 5 * compact


def submit_filters(b, **values) -> None:
    """Fill the filter form as a person would (type, choose), then press Enter."""
    for name, value in values.items():
        if name == "q":
            b.eval("(i => { i.value = ''; i.focus() })(document.querySelector('[name=q]'))")
            if value:
                b.send("Input.insertText", text=value)
        else:
            b.eval(f"document.querySelector('[name={name}]').value = {js(value)}")
    before = b.eval("location.href")
    b.eval("document.querySelector('#filters').requestSubmit()")
    b.wait(f"location.href !== {js(before)} && document.readyState === 'complete'"
           " && !!document.querySelector('#main')", what="the filtered page")


def test_filters_and_search_pick_hosts_and_survive_refreshes(big, b):
    b.open(f"{big.url}/gpu/cluster")
    b.wait("document.querySelector('#filters')")
    submit_filters(b, q="dgx-01")
    assert "q=dgx-01" in b.eval("location.search")
    assert shown_hosts(b) == [f"dgx-{n:03d}" for n in range(10, 20)]
    assert b.text("#shown").startswith("10 of 128 hosts match")
    assert b.text("#gpus-total") == "1024"          # the summary stays the cluster's

    # the page refreshes itself from the same URL: the filter holds
    stamp = b.eval("document.body.dataset.refreshed || ''")
    b.wait(f"(document.body.dataset.refreshed || '') !== {js(stamp)}", what="a refresh")
    assert shown_hosts(b) == [f"dgx-{n:03d}" for n in range(10, 20)]

    submit_filters(b, q="", state="unhealthy")
    assert shown_hosts(b) == [h for h, _, _ in BIG_UNHEALTHY]
    submit_filters(b, state="drained")
    assert shown_hosts(b) == list(BIG_DRAINED)

    # a job by name: the hosts its replicas run on
    live = big.scheduler.call("GET", "/api/v1/queue")
    gang = next(j for j in live if j["state"] == "admitted" and len(j["replicas"]) > 1)
    submit_filters(b, state="", q=gang["name"])
    assert shown_hosts(b) == sorted({r["host"] for r in gang["replicas"]})
    # a team and a rack: the rack's hosts where the team holds GPUs
    cluster = big.scheduler.call("GET", "/api/v1/cluster")
    rack = [h["rack"] for h in cluster["hosts"]
            if any(g.get("team") == "speech" for g in h["gpus"])][-1]
    want = [h["name"] for h in cluster["hosts"] if h["rack"] == rack
            and any(g.get("team") == "speech" for g in h["gpus"])]
    submit_filters(b, q="", team="speech", rack=rack)
    assert want and shown_hosts(b) == want
    b.open(f"{big.url}/gpu/cluster?q=no-such-host")
    assert shown_hosts(b) == [] and "0 of 128 hosts match" in b.text("#shown")


def test_pending_gang_shows_its_reservation(big, b):
    queue = big.scheduler.call("GET", "/api/v1/queue", params={"state": "pending"})
    job = next(j for j in queue
               if (j["pending"] or {}).get("details", {}).get("reserved_hosts"))
    details = job["pending"]["details"]
    b.open(f"{big.url}/gpu/jobs/{job['id']}")
    b.wait("document.querySelector('#reservation')", what="the reservation")
    assert attrs(b, "#reserved tbody tr", "data-host") == details["reserved_hosts"]
    cluster = {h["name"]: h for h in big.scheduler.call("GET", "/api/v1/cluster")["hosts"]}
    names = {j["id"]: j["name"] for j in big.scheduler.call("GET", "/api/v1/queue")}
    for host, gpus in details["reserved_gpus"].items():
        row = f"#reserved tr[data-host={js(host)}]"
        assert "GPU 0-7" in b.text(row) and len(gpus) == 8
        # the jobs on the reserved GPUs now: their ends let the gang start
        on = {names[g["job"]] for g in cluster[host]["gpus"] if g.get("job")}
        assert set(filter(None, b.text(f"{row} .held-by").split(", "))) == on or \
            (not on and b.text(f"{row} .held-by") == "free")
    # a gang waiting for a hundred jobs names the largest dozen, then how many more
    held = len(details["held_by"]) + details.get("held_by_more", 0)
    assert held > 12
    assert b.text("#blockers").endswith(f"and {held - 12} more jobs")
    assert len(attrs(b, "#blockers a", "href")) == 12
    shown = datetime.strptime(b.text("#reservation-start"), "%Y-%m-%d %H:%M UTC")
    planned = datetime.fromisoformat(job["eta_at"].replace("Z", "+00:00"))
    assert abs(shown.replace(tzinfo=UTC) - planned) < timedelta(minutes=2)


def test_queue_page_is_in_the_schedulers_order(big, b):
    b.open(f"{big.url}/gpu/queue")
    b.wait("document.querySelector('#pending tbody tr')")
    queue = big.scheduler.call("GET", "/api/v1/queue", params={"state": "pending"})
    assert attrs(b, "#pending tbody tr", "data-job") == [j["id"] for j in queue]
    assert attrs(b, "#pending tbody tr", "data-rank") == \
        [str(j["rank"]) if j["rank"] else "" for j in queue]
