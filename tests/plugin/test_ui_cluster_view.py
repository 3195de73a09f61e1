"""The cluster page's compact view, filters and MIG devices without a server."""

from __future__ import annotations

from airflow_gpu.plugin.views.cluster import cluster_page
from tests.plugin.viewdata import CLUSTER, LIVE, FakeSource, client, gpu, host


def big_cluster(n: int) -> dict:
    """n 4-GPU hosts, 8 per switch, 2 switches per rack."""
    return {"cluster": "big", "hosts": [
        host(f"n{i:03d}", f"r{i // 16}", f"s{i // 8}",
             [gpu(0, 0, "j1" if i == 5 else None, "vision" if i == 5 else None),
              gpu(1, 0), gpu(2, 1, healthy=i != 7), gpu(3, 1)], drained=i == 9)
        for i in range(n)]}


def test_compact_view_from_24_hosts_and_filters():
    small = cluster_page(CLUSTER, LIVE)
    assert small["view"] == "full" and not small["filtered"]
    big = big_cluster(128)
    page = cluster_page(big, LIVE)
    assert page["view"] == "compact" and page["shown_hosts"] == 128
    assert [r["name"] for r in page["racks"]] == [f"r{i}" for i in range(8)]
    assert page["racks"][0]["n_hosts"] == 16 and page["racks"][0]["gpus_total"] == 64
    assert cluster_page(big, LIVE, view="full")["view"] == "full"

    def shown(**f) -> list[str]:
        p = cluster_page(big, LIVE, **f)
        assert p["summary"]["hosts"] == 128          # the summary stays the cluster's
        return [h["name"] for r in p["racks"] for s in r["switches"] for h in s["hosts"]]

    assert shown(q="N01") == [f"n{i:03d}" for i in range(10, 20)]   # case-insensitive
    assert shown(q="train") == ["n005"] == shown(team="vision") == shown(state="held")
    assert shown(state="unhealthy") == ["n007"] and shown(state="drained") == ["n009"]
    assert shown(rack="r1") == [f"n{i:03d}" for i in range(16, 32)]
    assert shown(rack="r1", q="n005") == [] and len(shown(state="free")) == 127
    big["hosts"][3]["nvlink_domain"] = "nvl-a"         # GB200 trays sharing a fabric
    assert shown(q="NVL-A") == ["n003"]
    (cell,) = [g for r in page["racks"] for s in r["switches"] for h in s["hosts"]
               if h["name"] == "n007" for n in h["numa"] for g in n["gpus"]
               if g["state"] == "unhealthy"]
    assert cell["index"] == 2


def test_compact_view_renders_one_cell_per_gpu_and_keeps_the_filters():
    class Big(FakeSource):
        def cluster(self):
            return big_cluster(40)

    c = client(Big())
    body = c.get("/cluster").text
    assert 'id="compact"' in body and body.count('class="cg ') == 160
    assert 'data-gpu="n005:0" data-state="held" data-job="j1"' in body
    filtered = c.get("/cluster?q=n01&state=free").text
    assert filtered.count('class="chost ') == 10 and "10 of 40 hosts match" in filtered
    assert 'value="n01"' in filtered and '<option value="free" selected' in filtered
    assert 'id="compact"' not in c.get("/cluster?view=full").text
    assert c.get("/cluster?state=broken").status_code == 422
    assert c.get("/cluster?view=tiny").status_code == 422
    assert c.get("/api/cluster?team=vision").json()["shown_hosts"] == 1


def mig_cluster() -> dict:
    """Host a's GPU 2 in MIG mode (the service's cluster view: its devices, who holds
    each), one device held by j1."""
    devices = [{"gpu": 2, "index": i, "profile": p, "start": st, "uuid": f"MIG-{i}",
                "label": f"GPU 2 MIG {p} #{i}", "job": "j1" if i == 0 else None,
                "team": "vision" if i == 0 else None}
               for i, (p, st) in enumerate([("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2)])]
    a = host("a", "r1", "s1", [gpu(0, 0), gpu(1, 0),
                               gpu(2, 1, mig_mode=True, mig=devices), gpu(3, 1)])
    return {"cluster": "c", "hosts": [a]}


def test_mig_gpus_show_their_devices_and_who_holds_them():
    page = cluster_page(mig_cluster(), LIVE)
    (a,) = page["racks"][0]["switches"][0]["hosts"]
    g2 = a["numa"][1]["gpus"][0]
    assert g2["state"] == "mig" and [d["profile"] for d in g2["mig"]] == \
        ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert (g2["mig"][0]["job_name"], g2["mig"][0]["team"]) == ("train", "vision")
    # a MIG GPU is never free whole; its free devices are counted apart
    assert (a["gpus_free"], a["mig_devices"], a["mig_free"]) == (3, 3, 2)
    assert page["summary"]["mig_free"] == 2 and page["teams"][0]["name"] == "vision"
    assert cluster_page(mig_cluster(), LIVE, state="mig")["shown_hosts"] == 1
    assert cluster_page(mig_cluster(), LIVE, q="1g.5gb")["shown_hosts"] == 1
    assert cluster_page(mig_cluster(), LIVE, team="vision")["shown_hosts"] == 1

    class Mig(FakeSource):
        def cluster(self):
            return mig_cluster()

    for view in ("full", "compact"):
        html = client(Mig()).get(f"/cluster?view={view}").text
        assert html.count("data-mig=") == 3, view
        assert 'data-mig="a:2:0" data-job="j1"' in html
        assert "2</b> of 3 MIG devices free" in html
