"""The plugin's pages in headless Chromium against the real Airflow API server and the
real scheduler-core: what each page shows is asserted from the DOM against what the
scheduler's API says."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import httpx

from airflow_gpu.scheduler_core.engine.topology import format_cpulist
from tests.plugin.stack import DRAINED, TRAIN_KEY, UNHEALTHY, UNREACHABLE, UTILIZATION

LIVE = ("admitted", "running", "preempting")     # the states that hold resources


def js(value) -> str:
    return json.dumps(value)


def cells(browser, selector: str, attr: str) -> list:
    return browser.eval(f"[...document.querySelectorAll({js(selector)})]"
                        f".map(e => e.getAttribute({js(attr)}))")


def test_navigation_entry_opens_the_cluster_page_inside_airflow(stack, browser):
    browser.open(f"{stack.url}/")
    browser.wait("[...document.querySelectorAll('button')]"
                 ".find(b => b.getAttribute('aria-label') === 'Browse')", what="the nav")
    browser.eval("[...document.querySelectorAll('button')]"
                 ".find(b => b.getAttribute('aria-label') === 'Browse').click()")
    browser.wait("[...document.querySelectorAll('[role=menu] a')]"
                 ".find(a => a.innerText.trim() === 'GPU cluster')", what="the menu entry")
    browser.eval("[...document.querySelectorAll('[role=menu] a')]"
                 ".find(a => a.innerText.trim() === 'GPU cluster').click()")
    browser.wait("location.pathname.startsWith('/plugin/gpu_cluster')")
    hosts = browser.wait("(() => { const f = document.querySelector('iframe');"
                         " const d = f && f.contentDocument;"
                         " const h = d && [...d.querySelectorAll('[data-host]')];"
                         " return h && h.length ? h.map(e => e.dataset.host) : null })()",
                         what="the cluster page in the Airflow frame")
    cluster = stack.scheduler.call("GET", "/api/v1/cluster")
    assert hosts == [h["name"] for h in cluster["hosts"]]


def test_cluster_page_shows_racks_hosts_gpus_jobs_and_bad_parts(stack, browser):
    browser.open(f"{stack.url}/gpu/cluster")
    browser.wait("document.querySelector('[data-host]')")
    cluster = stack.scheduler.call("GET", "/api/v1/cluster")
    live = {j["id"]: j for s in LIVE
            for j in stack.scheduler.call("GET", "/api/v1/jobs", params={"state": s})}

    assert cells(browser, "[data-rack]", "data-rack") == ["rack-1", "rack-2"]
    assert cells(browser, "[data-switch]", "data-switch") == ["leaf-1", "leaf-2", "leaf-3"]
    assert cells(browser, "[data-switch=leaf-2] [data-host]", "data-host") == \
        ["dgx-h-01", "dgx-h-02"]
    gpus = [f"{h['name']}:{g['index']}" for h in cluster["hosts"] for g in h["gpus"]]
    assert sorted(cells(browser, "[data-gpu]", "data-gpu")) == sorted(gpus)
    assert browser.text("#gpus-total") == str(len(gpus))
    # every held GPU shows its job's name and team; every other GPU holds no job
    for h in cluster["hosts"]:
        for g in h["gpus"]:
            cell = f"[data-gpu={js(h['name'] + ':' + str(g['index']))}]"
            text = browser.text(cell)
            if g["job"]:
                assert live[g["job"]]["name"] in text and g["team"] in text, (cell, text)
            else:
                assert browser.eval(f"document.querySelector({js(cell)}).dataset.job") is None
    # the unhealthy GPU and the drained host stand out, with the reason written out
    host, index, reason = UNHEALTHY
    sick = f"[data-gpu={js(f'{host}:{index}')}]"
    assert "sick" in browser.eval(f"document.querySelector({js(sick)}).className")
    assert reason in browser.eval(f"document.querySelector({js(sick)}).title")
    assert browser.text("#gpus-unhealthy") == "1"
    assert browser.eval(f"document.querySelector('[data-host={js(host)}]').dataset.status") \
        == "degraded"
    assert browser.eval(f"document.querySelector('[data-host={js(DRAINED)}]').dataset.status") \
        == "drained"
    assert "drained" in browser.text(f"[data-host={js(DRAINED)}] header").lower()
    gone = f"[data-host={js(UNREACHABLE)}]"
    assert browser.eval(f"document.querySelector({js(gone)}).dataset.status") == "unreachable"
    assert "unreachable" in browser.text(f"{gone} header").lower()
    assert set(browser.eval(f"[...document.querySelectorAll({js(gone + ' .idle')})]"
                            ".map(e => e.innerText)")) == {"unreachable"}
    # utilization where a node agent reported it, and no bar where none did
    for name, values in UTILIZATION.items():
        shown = browser.eval(f"[...document.querySelectorAll('[data-host={name}] .util em')]"
                             ".map(e => e.innerText)")
        assert shown == [f"{u}%" for u in values]
    assert browser.eval("document.querySelectorAll('[data-host=dgx-v-01] .util').length") == 0
    # NUMA nodes and NVLink groups: a DGX-1 shows two quads, an A100 one NVSwitch group
    assert cells(browser, "[data-host=dgx-v-01] [data-numa]", "data-numa") == ["0", "1"]
    assert "A: GPU 0-3, B: GPU 4-7" in browser.text("[data-host=dgx-v-01] .nvlink")
    assert "all 8 GPUs in one group" in browser.text("[data-host=dgx-a-01] .nvlink")
    assert cells(browser, "[data-host=dgx-a-01] [data-numa]", "data-numa") == \
        ["3", "1", "7", "5"]


def test_queue_page_orders_pending_jobs_and_says_why_they_wait(stack, browser):
    browser.open(f"{stack.url}/gpu/queue")
    browser.wait("document.querySelector('#pending tbody tr')")
    pending = stack.scheduler.call("GET", "/api/v1/jobs", params={"state": "pending"})
    by_name = {j["name"]: j for j in pending}
    names = cells(browser, "#pending tbody tr", "data-name")
    # the scheduler's order (squeue's, `airflow-gpu queue`), rank by rank
    queue = stack.scheduler.call("GET", "/api/v1/queue", params={"state": "pending"})
    assert names == [j["name"] for j in queue] == ["urgent-eval", "llm-pretrain",
                                                   "sweep-small"]
    assert cells(browser, "#pending tbody tr", "data-rank") == [
        str(j["rank"]) for j in queue]
    band, score = browser.text("#pending tbody tr[data-name=llm-pretrain] .band").split(" / ")
    # the score's age term grows by the second
    assert float(band) == queue[1]["band"] and abs(float(score) - queue[1]["score"]) < 0.1
    llm = browser.text("#pending tbody tr[data-name=llm-pretrain]")
    assert "Resources" in llm and "under one switch" in llm
    assert "waits for vision_pipeline.train (8 GPUs)" in llm   # a name, not a job id
    assert by_name["llm-pretrain"]["pending"]["eta_seconds"] > 0
    assert browser.text("#pending tbody tr[data-name=llm-pretrain] .eta").startswith("in 1h")
    sweep = browser.text("#pending tbody tr[data-name=sweep-small]")
    assert "Quota" in sweep and by_name["sweep-small"]["pending"]["reason"] in sweep

    live = {j["name"]: j for s in LIVE
            for j in stack.scheduler.call("GET", "/api/v1/jobs", params={"state": s})}
    assert sorted(cells(browser, "#live tbody tr", "data-name")) == sorted(live)
    for name, job in live.items():
        row = f"#live tbody tr[data-name={js(name)}]"
        text = browser.text(row)
        assert job["team"] in text and job["state"] in text
        for r in job["replicas"]:
            assert r["host"] in text
        # work admitted beyond its team's guarantee is marked, and only that
        assert browser.eval(f"!!document.querySelector({js(row + ' .tag.borrowed')})") == \
            job["borrowed"], name
    assert "dgx-v-01: GPU 0-7" in browser.text("#live tbody tr[data-name=bert-finetune]")
    assert "/ 2h" in browser.text("#live tbody tr[data-name='vision_pipeline.train']")

    # nlp reclaims the H100s vision borrowed: vit-large stops for urgent-eval, which waits
    urgent, vit = by_name["urgent-eval"], live["vit-large"]
    assert (vit["state"], vit["borrowed"], vit["preempted_by"]) == (
        "preempting", True, urgent["id"])
    assert urgent["pending"]["code"] == "Preempting"
    assert urgent["pending"]["details"]["victims"] == [vit["id"]]
    row = "#live tbody tr[data-name=vit-large]"
    assert browser.text(f"{row} .state") == "preempting"
    assert browser.text(f"{row} .preempted-by").startswith("for urgent-eval, stopped within ")
    assert browser.eval(f"document.querySelector({js(row + ' .preempted-by a')})"
                        ".getAttribute('href')").endswith(f"/jobs/{urgent['id']}")
    row = "#pending tbody tr[data-name=urgent-eval]"
    assert "Preempting" in browser.text(f"{row} .reason")
    assert "preempting vit-large" in browser.text(f"{row} .reason")     # a name, not an id
    assert browser.text(f"{row} .victims") == "preempts vit-large"
    assert browser.eval(f"document.querySelector({js(row + ' .victims a')})"
                        ".getAttribute('href')").endswith(f"/jobs/{vit['id']}")


def test_job_page_shows_placement_events_and_the_task_instance(stack, browser):
    job_id = stack.scheduler.ids["bert-finetune"]
    job = stack.scheduler.call("GET", f"/api/v1/jobs/{job_id}")
    browser.open(f"{stack.url}/gpu/jobs/{job_id}")
    browser.wait("document.querySelector('#replicas tbody tr')")
    rows = browser.eval("[...document.querySelectorAll('#replicas tbody tr')]"
                        ".map(r => [...r.cells].map(c => c.innerText.trim()))")
    assert len(rows) == len(job["replicas"]) == 2
    for row, r in zip(rows, job["replicas"], strict=True):
        assert row[0] == f"{r['role']}[{r['index']}]" and row[1] == r["host"]
        assert row[2] == "rack-2 / leaf-3"
        assert row[3] == f"{r['gpus'][0]}-{r['gpus'][-1]}"
        assert row[4].startswith(format_cpulist(r["cpus"]))    # whole cores: i, i + 40
        assert row[5] == ", ".join(r["memory_by_numa"])
        assert row[7] == ", ".join(r["nics"])
    kinds = cells(browser, "#events li", "data-kind")
    assert kinds[:2] == ["submitted", "admitted"]
    assert "Not submitted by an Airflow task" in browser.text(".ti")
    assert job["time_limit_s"] == 6 * 3600
    assert browser.text("#job-limit") == "time limit 6h"        # elapsed against it


def test_job_page_shows_its_accounting_and_utilization_chart(stack, browser):
    """The service's usage of the job (the demo's one node agent report) as totals, a row
    per replica and an inline SVG chart; a job on hosts without telemetry has no samples."""
    job_id = stack.scheduler.ids["vision_pipeline.train"]
    usage = stack.scheduler.call("GET", f"/api/v1/jobs/{job_id}/usage")
    assert usage["series"] and usage["utilization_peak"] == max(UTILIZATION["dgx-a-01"])
    browser.open(f"{stack.url}/gpu/jobs/{job_id}")
    browser.wait("document.querySelector('#accounting')")
    # one point per sample: on the lines, or a dot where a sample stands alone
    points = browser.eval(
        "[...document.querySelectorAll('#usage-chart polyline.util')]"
        ".reduce((n, l) => n + l.getAttribute('points').split(' ').length, 0)"
        " + document.querySelectorAll('#usage-chart circle.util').length")
    assert points == len(usage["series"])
    assert browser.eval("[...document.querySelectorAll('#usage-chart .util-tick')]"
                        ".map(t => t.textContent)") == ["0 %", "50 %", "100 %"]
    start, end = browser.eval("['.time-start', '.time-end'].map(c => document"
                              ".querySelector('#usage-chart ' + c).textContent)")
    assert start.startswith(usage["series"][0]["at"][:10]) and end     # the date, a time
    assert browser.text("#usage-util").endswith(f"peak {usage['utilization_peak']:g} %")
    assert cells(browser, "#usage-replicas tbody tr", "data-host") == \
        [r["host"] for r in usage["replicas"]]

    bert = stack.scheduler.ids["bert-finetune"]          # V100 hosts: no node agent
    assert stack.scheduler.call("GET", f"/api/v1/jobs/{bert}/usage")["series"] == []
    browser.open(f"{stack.url}/gpu/jobs/{bert}")
    browser.wait("document.querySelector('#accounting')")
    assert "no samples yet" in browser.text("#usage-chart-empty")
    assert not browser.eval("!!document.querySelector('#usage-chart')")


def test_preempted_job_page_says_by_whom_why_and_how_it_stops(stack, browser):
    vit_id, urgent_id = (stack.scheduler.ids[n] for n in ("vit-large", "urgent-eval"))
    job = stack.scheduler.call("GET", f"/api/v1/jobs/{vit_id}")
    opened = time.time()
    browser.open(f"{stack.url}/gpu/jobs/{vit_id}")
    browser.wait("document.querySelector('#preemption')")
    assert browser.text("#job-state") == "preempting"
    assert browser.text("#job-borrowed") == "borrowed"
    assert browser.text("#preempted-by") == "Preempted by urgent-eval (1 preemption so far)"
    assert browser.eval("document.querySelector('#preempted-by a').getAttribute('href')") \
        .endswith(f"/jobs/{urgent_id}")
    assert browser.text("#preempt-reason") == job["preempt_reason"]
    assert "reclaim" in job["preempt_reason"]
    assert (job["preempt_signal"], job["preempt_grace"]) == ("SIGTERM", 3600)
    stop = browser.text("#preempt-stop")
    assert stop.startswith("Its replicas get SIGTERM, then SIGKILL after 1h; it keeps its "
                           "GPUs until its launcher confirms the stop"), stop
    read = time.time()
    # the time left to the forced requeue (the grace and 10 s of slack from the
    # preemption), as it was while the page was open
    shown = re.search(r"requeued by force in (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)? at the "
                      r"latest\.$", stop)
    assert shown, stop
    left = sum(int(n or 0) * f for n, f in zip(shown.groups(), (3600, 60, 1), strict=True))
    deadline = datetime.fromisoformat(job["preempt_deadline_at"]).timestamp()
    assert deadline - read - 61 <= left <= deadline - opened + 1 <= 3611, (stop, deadline)

    browser.open(f"{stack.url}/gpu/jobs/{urgent_id}")
    browser.wait("document.querySelector('#why')")
    assert browser.text("#why .code") == "Preempting"
    assert browser.text("#victims") == "Preempts vit-large: starts once they have stopped"
    assert not browser.eval("!!document.querySelector('#preemption')")


def test_pending_job_page_names_its_reason_eta_and_blocker(stack, browser):
    job_id = stack.scheduler.ids["llm-pretrain"]
    browser.open(f"{stack.url}/gpu/jobs/{job_id}")
    browser.wait("document.querySelector('#why')")
    explain = stack.scheduler.call("GET", f"/api/v1/jobs/{job_id}/explain")
    why = browser.text("#why")
    assert explain["code"] in why and "needs worker 2x(6 GPUs [A100]" in why
    assert browser.text("#eta").startswith("in 1h")
    assert browser.text("#blockers") == "Waits for vision_pipeline.train (8 GPUs)"


def test_job_page_links_back_to_its_task_instance(stack, browser):
    """Inside the Airflow UI's frame the link moves the Airflow UI itself."""
    job_id = stack.scheduler.ids["vision_pipeline.train"]
    dag, task, run, _, _ = TRAIN_KEY.split("/")
    expected = f"/dags/{dag}/runs/{run.replace(':', '%3A').replace('+', '%2B')}/tasks/{task}"
    browser.open(f"{stack.url}/plugin/gpu_cluster/gpu/jobs/{job_id}")
    frame = "document.querySelector('iframe').contentDocument"
    browser.wait(f"{frame} && {frame}.querySelector('#ti-link')", what="the job page")
    assert browser.eval(f"{frame}.querySelector('#ti-link').getAttribute('href')") == expected
    assert browser.eval(f"{frame}.querySelector('#ti-link').innerText") == \
        f"{dag} › {task} › {run}"
    browser.eval(f"{frame}.querySelector('#ti-link').click()")
    browser.wait(f"location.pathname === {js(expected)}", what="the task instance page")
    assert not browser.eval("location.pathname.startsWith('/plugin')")


def test_teams_page_shows_quota_fair_share_and_history(stack, browser):
    browser.open(f"{stack.url}/gpu/teams")
    browser.wait("document.querySelector('#teams tbody tr')")
    teams = {t["name"]: t for t in stack.scheduler.call("GET", "/api/v1/teams")}
    assert cells(browser, "#teams tbody tr", "data-team") == sorted(teams)
    for name, t in teams.items():
        row = f"#teams tbody tr[data-team={js(name)}]"
        assert browser.text(f"{row} .held") == str(t["held_gpus"])
        assert browser.text(f"{row} .quota") == str(t["quota_gpus"])
        assert browser.text(f"{row} .borrowed") == str(t["borrowed_gpus"])
        assert browser.text(f"{row} .lent") == str(t["lent_gpus"])
        assert browser.eval(f"document.querySelector({js(row + ' polyline.held')})"
                            ".getAttribute('points').split(' ').length") >= 2
        assert browser.eval(f"!!document.querySelector({js(row + ' line.quota')})")
    # vision holds 16 GPUs on its guarantee of 8: 8 borrowed, from nlp's idle guarantee
    # (40, of which nlp's live jobs hold 8; the guarantees sum to the cluster's 48)
    assert [(t["quota_gpus"], t["borrow_gpus"], t["held_gpus"], t["borrowed_gpus"],
             t["lent_gpus"]) for t in (teams["vision"], teams["nlp"])] == [
        (8, 8, 16, 8, 0), (40, 0, 8, 0, 8)]
    assert browser.text("#teams tbody tr[data-team=vision] .borrow") == "+8"
    assert browser.text("#teams tbody tr[data-team=nlp] .borrow") == "none (hard quota)"
    # 31 usable GPUs (48, less the drained and the unreachable host's and one unhealthy)
    # split 2:1, but vision may hold at most 16 (8 + 8 borrowed) and nlp gets the other
    # 15 (it asks for 28)
    assert browser.text("#teams tbody tr[data-team=vision] .fair") == "16"
    assert browser.text("#teams tbody tr[data-team=nlp] .fair") == "15"


def test_pages_refresh_on_their_own(stack, browser):
    browser.open(f"{stack.url}/gpu/queue")
    browser.wait("document.querySelector('#pending tbody tr')")
    job = stack.scheduler.call("POST", "/api/v1/jobs", who="nlp", json={"spec": {
        "name": "late-arrival", "expected_runtime": "1h",
        "roles": [{"name": "main", "gpus": 8, "gpu": {"model": ["A100"]}}],
        "placement": {"locality": "host"}, "priority": -5}})
    try:
        browser.wait("document.querySelector('#pending tbody tr[data-name=late-arrival]')",
                     timeout=30, what="the new job to appear without a reload")
        assert browser.eval("performance.getEntriesByType('navigation').length") == 1
    finally:
        stack.scheduler.call("DELETE", f"/api/v1/jobs/{job['id']}", who="nlp")
    browser.wait("!document.querySelector('#pending tbody tr[data-name=late-arrival]')",
                 timeout=30, what="the cancelled job to leave the page")


def test_pages_load_nothing_from_outside(stack, browser):
    """Assets come from the package: no CDN, no other origin."""
    for page in ("cluster", "queue", "teams"):
        browser.open(f"{stack.url}/gpu/{page}")
        browser.wait("document.querySelector('main section')")
        urls = browser.eval("performance.getEntriesByType('resource').map(e => e.name)")
        assert urls and all(u.startswith(stack.url + "/gpu/") for u in urls), urls
    html = httpx.get(f"{stack.url}/gpu/cluster", cookies={"_token": stack.airflow.token()}).text
    assert "http://" not in html and "https://" not in html
