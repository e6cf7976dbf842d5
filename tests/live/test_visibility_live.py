"""Operators can see why, on a running worker with a real Kafka broker and Redis server
(``scripts/services.sh``): ``fairstream status`` and ``fairstream pending``, the /v1 HTTP API,
and the web page in a real headless browser (Debian's chromium and chromedriver, which the
services script installs). Nothing is mocked."""

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

from fairstream.producers.client import Publisher
from fairstream.wire.topics import Topics

from test_worker_live import BROKER, REDIS, ROOT, Worker

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", autouse=True)
def services():
    """Kafka, Redis, chromium and chromedriver, installed and started if they are not."""
    subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "start"], check=True, capture_output=True)


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(condition, timeout: float = 90.0, every: float = 0.2):
    """``condition()``'s first true value, checked every ``every`` s (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (OSError, urllib.error.URLError):
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(every)


def publish(topics: Topics, events: list[tuple]) -> None:
    async def send():
        async with Publisher(BROKER, topics) as pub:
            for kind, *args in events:
                if kind == "node":
                    await pub.heartbeat("c1", args[0], args[1], args[2])
                else:
                    name, tenant, demand, at, count = args
                    await pub.submit("c1", name, tenant=tenant, demand=demand, time=at, count=count)

    asyncio.run(send())


def fairstream(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fairstream.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def started_worker(tmp_path) -> tuple[str, Topics, Worker]:
    """A worker on topics and Redis keys of its own, writing its explanation every 0.2 s."""
    app_id = f"t{uuid.uuid4().hex[:8]}"
    return app_id, Topics().with_prefix(app_id), Worker(app_id, tmp_path, "--explain-interval", "0.2").start()


def test_status_pending_and_the_http_api_of_a_running_worker(tmp_path):
    app_id, topics, worker = started_worker(tmp_path)
    try:
        # One node of 4 cpu: A's request of 100,000 unit tasks takes all 4; B's task of 2 cpu
        # waits first in DRF's order (it holds nothing), A's 99,996 behind it.
        publish(topics, [("node", "n1", 0, {"cpu": 4, "mem": 8}),
                         ("task", "maps", "A", {"cpu": 1, "mem": 1}, 0, 100_000),
                         ("task", "b1", "B", {"cpu": 2, "mem": 1}, 1, None)])
        port = worker.metrics_port
        tenants = wait_for(lambda: (doc := get(port, "/v1/clusters/c1/tenants")[1]).get("time") == 1 and doc)
        assert [(t["tenant"], t["rank"], t["running"], t["pending"]) for t in tenants["tenants"]] == [
            ("B", 1, 0, 1), ("A", 2, 4, 99_996)]
        assert tenants["order"] == "dominant share / weight" and tenants["api"] == "v1"
        status, clusters = get(port, "/v1/clusters")
        assert status == 200 and clusters["clusters"][0]["cluster"] == "c1"
        status, page = get(port, "/v1/clusters/c1/pending?tenant=A&size=10")
        assert status == 200 and page["tasks_total"] == 99_996 and page["entries"][0]["reason"] == "behind_tenants"
        status, found = get(port, "/v1/clusters/c1/pending?task=maps-77777")
        assert status == 200 and found["position"] == 77_777 - 4 and found["entry"]["waits_for"] == "B"
        assert get(port, "/v1/clusters/nope/tenants")[0] == 404
        history = get(port, "/v1/clusters/c1/history")[1]
        assert history["samples"] and history["samples"][-1]["tenants"]["A"]["share"] == 1.0

        printed = fairstream("status", "--cluster", "c1", "--redis", REDIS, "--app-id", app_id)
        lines = printed.splitlines()
        assert "policy drf" in lines[0] and lines[2].split()[:2] == ["B", "1"] and lines[3].split()[:2] == ["A", "2"]
        printed = fairstream("pending", "--cluster", "c1", "--redis", REDIS, "--app-id", app_id, "--task", "maps-77777")
        assert "position 77773" in printed and "behind_tenants" in printed and "freed room goes first to B" in printed
        printed = fairstream("pending", "--cluster", "c1", "--redis", REDIS, "--app-id", app_id, "--json")
        assert json.loads(printed)["entries_total"] == 2
        printed = fairstream("pending", "--cluster", "c1", "--redis", REDIS, "--app-id", app_id, "--reason",
                             "behind_tenants").splitlines()
        assert "99996 pending tasks in 1 entries waiting for behind_tenants" in printed[0]
        assert printed[1].split()[:5] == ["tenant", "rank", "position", "task", "or"]
        # No task said how long it runs: when A's request starts is unknown.
        assert printed[2].split()[:6] == ["A", "2", "0", "maps", "99996", "unknown"] and len(printed) == 3
        missing = subprocess.run([sys.executable, "-m", "fairstream.cli", "pending", "--cluster", "c1", "--redis", REDIS,
                                  "--app-id", app_id, "--tenant", "Z"], capture_output=True, text=True, cwd=ROOT)
        assert missing.returncode == 2 and "tenant Z: not a tenant of cluster c1" in missing.stderr
        assert missing.stderr.count("\n") == 1
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "fairstream_decisions_total" in metrics
        assert 'fairstream_tenant_pending_tasks{cluster="c1",tenant="A"} 99996.0' in metrics
    finally:
        worker.stop()


def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def table(driver) -> dict[str, list[str]]:
    """The tenants table as the page shows it now, read in one script call: the page rebuilds
    its rows every refresh, so rows found one call and read the next may be gone (stale)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tenants tbody tr')).map("
        "r => [r.dataset.tenant, Array.from(r.cells).map(c => c.textContent)]);")
    return dict((tenant, cells) for tenant, cells in rows)


def test_the_web_page_shows_a_running_workers_tenants_and_updates_after_new_decisions(tmp_path):
    app_id, topics, worker = started_worker(tmp_path)
    driver = None
    try:
        publish(topics, [("node", "n1", 0, {"cpu": 8, "mem": 16}),
                         ("task", "a", "A", {"cpu": 1, "mem": 1}, 0, 6),
                         ("task", "b", "B", {"cpu": 1, "mem": 1}, 1, 6)])
        port = worker.metrics_port
        wait_for(lambda: get(port, "/v1/clusters/c1/tenants")[1].get("time") == 1)
        driver = browser(tmp_path)
        driver.get(f"http://127.0.0.1:{port}/")
        # A's 6 started at t = 0 on the 8 cpu; B's at t = 1 found 2 free: 2 run, 4 wait.
        first = wait_for(lambda: (rows := table(driver)) and set(rows) == {"A", "B"} and rows)
        assert first["A"][7:9] == ["6", "0"] and first["B"][7:9] == ["2", "4"]
        assert driver.find_element("id", "policy").text == "drf"
        # New decisions reach the page without a reload: C arrives; A's first tasks finish.
        asyncio.run(_complete_and_submit(topics))
        later = wait_for(lambda: (rows := table(driver)) and "C" in rows and rows)
        assert set(later) == {"A", "B", "C"}
        wait_for(lambda: driver.find_elements("css selector", "#share-chart polyline[data-series='A']"))
        driver.save_screenshot(str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").stat().st_size > 10_000
        assert not driver.find_element("id", "error").text
    finally:
        if driver is not None:
            driver.quit()
        worker.stop()


async def _complete_and_submit(topics: Topics) -> None:
    async with Publisher(BROKER, topics) as pub:
        for k in range(2):
            await pub.complete("c1", f"a-{k}", time=5)
        await pub.submit("c1", "c", tenant="C", demand={"cpu": 1, "mem": 1}, time=5, count=3)


def test_a_weight_changed_on_a_running_worker_moves_the_shares(tmp_path):
    app_id, topics, worker = started_worker(tmp_path)
    try:
        # 8 GB; A and B each a request of 100 tasks of 1 GB: 4 each under equal weights.
        publish(topics, [("node", "n1", 0, {"cpu": 8, "mem": 8}),
                         ("task", "a", "A", {"cpu": 1, "mem": 1}, 0, 100),
                         ("task", "b", "B", {"cpu": 1, "mem": 1}, 0, 100)])
        port = worker.metrics_port
        running = lambda: {t["tenant"]: t["running"] for t in get(port, "/v1/clusters/c1/tenants")[1].get("tenants", [])}
        wait_for(lambda: running() == {"A": 4, "B": 4})
        config = tmp_path / "tenants.json"
        config.write_text(json.dumps({"tenants": [{"id": "A", "weight": 3}, {"id": "B"}]}))
        state = ("--cluster", "c1", "--broker", BROKER, "--topic-prefix", app_id, "--redis", REDIS, "--app-id", app_id)
        # --dry-run: the fair shares before and after, from the cluster's state in Redis; nothing sent.
        shown = json.loads(fairstream("configure", "--tenants", str(config), "--dry-run", *state))
        assert {t["tenant"]: (t["fair_share_before"], t["fair_share_after"]) for t in shown["tenants"]} == {
            "A": (0.5, 0.75), "B": (0.5, 0.25)}
        # A tree the worker would reject is refused before it is sent, with the worker's reason:
        # A cannot move under a new queue g while the cluster runs.
        moved = tmp_path / "moved.json"
        moved.write_text(json.dumps({"tenants": [{"id": "g"}, {"id": "A", "parent": "g"}, {"id": "B"}]}))
        refused = subprocess.run([sys.executable, "-m", "fairstream.cli", "configure", "--tenants", str(moved), *state],
                                 capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert "the worker would reject it: tenants[A].parent" in refused.stderr
        sent = json.loads(fairstream("configure", "--tenants", str(config), *state))
        assert sent == {"cluster": "c1", "tenants": 2, "sent": True, "checked": "against the cluster's state"}
        wait_for(lambda: {t["tenant"]: t["weight"] for t in get(port, "/v1/clusters/c1/tenants")[1]["tenants"]}
                 == {"A": 3.0, "B": 1.0})
        # The eight running tasks end at t = 5: A's share is now 3/4, so A gets 6 and B 2.
        async def finish():
            async with Publisher(BROKER, topics) as pub:
                for task in ["a-0", "a-1", "a-2", "a-3", "b-0", "b-1", "b-2", "b-3"]:
                    await pub.complete("c1", task, time=5)

        asyncio.run(finish())
        assert wait_for(lambda: running() == {"A": 6, "B": 2})
    finally:
        worker.stop()


def page_tables(driver) -> dict[str, list[list[str]]]:
    """Every table of the page as its cells' text, read in one script call."""
    return driver.execute_script(
        "const out = {}; for (const t of document.querySelectorAll('table')) out[t.id] = "
        "Array.from(t.querySelectorAll('tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent));"
        "return out;")


def test_the_page_an_operator_opens_first_has_its_data_at_the_first_paint(tmp_path):
    # drf with preemption after 1 s on one node of 4 cpu: A runs 4 unit tasks (two from t = 0,
    # two from 1); B asks for 4 at t = 2 and is starved (fair share 2, holds 0); the heartbeat
    # at t = 5 brings a pass that preempts A's two youngest for B. Then a tenants.config that
    # weighs B 2 is applied, and one with an ordering the worker lacks is rejected.
    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    worker = Worker(app_id, tmp_path, "--explain-interval", "0.2", "--param", "preemption=on",
                    "--param", "preemption_timeout=1").start()
    driver = None
    try:
        publish(topics, [("node", "n1", 0, {"cpu": 4, "mem": 8})]
                + [("task", f"a{k}", "A", {"cpu": 1, "mem": 1}, k // 2, None) for k in range(4)]
                + [("task", f"b{k}", "B", {"cpu": 1, "mem": 1}, 2, None) for k in range(4)])
        port = worker.metrics_port
        # Each next message only after the last is applied: on another topic it could overtake.
        wait_for(lambda: sum(t["pending"] for t in get(port, "/v1/clusters/c1/tenants")[1].get("tenants", [])) == 4)
        publish(topics, [("node", "n1", 5, {"cpu": 4, "mem": 8})])
        wait_for(lambda: len(get(port, "/v1/clusters/c1/events")[1].get("events", [])) == 2)

        async def configure():
            async with Publisher(BROKER, topics) as pub:
                await pub.configure("c1", [{"id": "A"}, {"id": "B", "weight": 2}], time=6)
                await pub.send(topics.config, {"cluster": "c1", "time": 7, "tenants": [{"id": "A", "ordering": "lifo"}]})

        asyncio.run(configure())
        wait_for(lambda: len(get(port, "/v1/clusters/c1/events")[1].get("events", [])) == 4)
        wait_for(lambda: get(port, "/v1/clusters/c1/tenants")[1].get("time") == 6)
        driver = browser(tmp_path)
        # refresh=0: the page fetches nothing, so whatever it shows came with it.
        driver.get(f"http://127.0.0.1:{port}/?refresh=0")
        assert driver.execute_script("return document.body.dataset.source") == "page"
        assert driver.find_element("id", "updated").text != "never" and not driver.find_element("id", "error").text
        tables = page_tables(driver)
        # B weighs 2 now: its fair share is 2/3, A's 1/3; each runs 2 of the 4 cpu.
        queues = {row[0].strip(): row for row in tables["queues"]}
        assert set(queues) == {"A", "B"}
        assert queues["B"][1:7] == ["2.00", "-", "0.6667", "0.5000", "2", "2"]
        assert queues["A"][1:7] == ["1.00", "-", "0.3333", "0.5000", "2", "2"]
        assert sum(int(row[1]) for row in tables["reasons"]) == 4
        # Configuration changes apart from preemptions; A's two preempted tasks ran 4 s each.
        assert [row[1] for row in tables["changes"]] == ["config rejected", "config accepted"]
        assert "tenants.0.ordering" in tables["changes"][0][2]
        assert [(row[1], row[4]) for row in tables["events"]] == [("A", "4"), ("A", "4")]
        assert tables["preempted"] == [["A", "2", "8"]]
        assert {row[0] for row in tables["pending"]} == {"A", "B"}
        assert {row[5] for row in tables["pending"]} == {"unknown"}  # no task said how long it runs
        driver.save_screenshot(str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").stat().st_size > 10_000
    finally:
        if driver is not None:
            driver.quit()
        worker.stop()


LAPTOP = (1366, 768)  # the most common laptop screen (CSS pixels)


def artifacts_dir():
    """Where CI keeps what a run shows (``FAIRSTREAM_ARTIFACTS``, else ``artifacts/`` in the
    checkout; .ci/run lists it at the end)."""
    import os
    from pathlib import Path

    folder = Path(os.environ.get("FAIRSTREAM_ARTIFACTS") or ROOT / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def busy_tree() -> list[dict]:
    """30 tenants in 3 levels: divisions d0-d2, two teams each, five leaves a team (l00-l29)."""
    tree = []
    for d in range(3):
        tree.append({"id": f"d{d}", "weight": d + 1})
        for t in range(2):
            tree.append({"id": f"d{d}t{t}", "parent": f"d{d}"})
            tree += [{"id": f"l{10 * d + 5 * t + k:02d}", "parent": f"d{d}t{t}"} for k in range(5)]
    return tree


def test_the_page_at_laptop_size_for_a_busy_tree_opens_on_the_busiest_cluster_and_fits(tmp_path):
    # drf, preemption after 2 s; cluster c1 of 8 nodes of 8 cpu and a 30-tenant tree of 3 levels.
    # At 0 ten tenants ask for 10 long tasks each (64 run); at 1 ten more ask for 4 each and are
    # starved; the heartbeat at 4 brings the preemptions. At 5 the tree is sent again with d0
    # weighing 4 (a configuration change), l20 asks for a whole node (8 cpu) and nine more
    # tenants for 2 tasks each: l20 is first in line and no node has room, so a node is reserved
    # for it (its timeout has not passed by the last heartbeat, at 6). Cluster a-idle, first by
    # name, has one node and nothing else: the page must open on c1.
    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": busy_tree()}))
    worker = Worker(app_id, tmp_path, "--explain-interval", "0.2", "--tenants", str(tenants), "--resources", "cpu,mem",
                    "--param", "preemption=on", "--param", "preemption_timeout=2").start()
    driver = None
    port = worker.metrics_port
    tenants_of = lambda: get(port, "/v1/clusters/c1/tenants")[1].get("tenants", [])

    async def send(*messages):
        async with Publisher(BROKER, topics) as pub:
            for kind, *args in messages:
                await getattr(pub, kind)(*args)

    try:
        node = {"cpu": 8, "mem": 32}
        asyncio.run(send(("heartbeat", "a-idle", "m0", 0, node),
                         *[("heartbeat", "c1", f"n{k}", 0, node) for k in range(8)],
                         *[("submit", "c1", f"a{k}", f"l{k:02d}", {"cpu": 1, "mem": 1}, 0, None, None, 10)
                           for k in range(10)]))
        wait_for(lambda: sum(t["running"] for t in tenants_of()) == 64)
        asyncio.run(send(*[("submit", "c1", f"b{k}", f"l{k:02d}", {"cpu": 1, "mem": 1}, 1, None, None, 4)
                           for k in range(10, 20)]))
        wait_for(lambda: sum(t["pending"] for t in tenants_of()) == 36 + 40)
        asyncio.run(send(("heartbeat", "c1", "n0", 4, node)))
        wait_for(lambda: get(port, "/v1/clusters/c1/events")[1].get("preempted"))
        weighed = [{**t, "weight": 4} if t["id"] == "d0" else t for t in busy_tree()]
        asyncio.run(send(("configure", "c1", weighed, 5),
                         ("submit", "c1", "big", "l20", {"cpu": 8, "mem": 8}, 5),
                         *[("submit", "c1", f"c{k}", f"l{k}", {"cpu": 1, "mem": 1}, 5, None, None, 2)
                           for k in range(21, 30)]))
        wait_for(lambda: sum(t["pending"] for t in tenants_of()) >= 1 + 18)
        asyncio.run(send(("heartbeat", "c1", "n0", 6, node)))
        nodes = wait_for(lambda: (doc := get(port, "/v1/clusters/c1/nodes")[1]).get("time") == 6 and doc)
        assert nodes["reservation"] is not None and nodes["reservation"]["tenant"] == "l20", nodes["reservation"]
        events = get(port, "/v1/clusters/c1/events")[1]

        driver = browser(tmp_path)
        driver.set_window_size(*LAPTOP)
        # The page as it came (refresh=0: it fetches nothing), no cluster named in the address.
        driver.get(f"http://127.0.0.1:{port}/?refresh=0")
        assert driver.execute_script("return document.getElementById('cluster').value") == "c1"
        assert not driver.find_element("id", "error").text
        width = driver.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], f"the page is wider than a laptop's screen: {width}"
        tables = page_tables(driver)
        assert len(tables["tenants"]) == 30 and len(tables["queues"]) == 30 + 6 + 3
        # Preemptions: per tenant totals as the API has them; the changes apart.
        assert [(row[0], int(row[1])) for row in tables["preempted"]] == [
            (p["tenant"], p["tasks"]) for p in events["preempted"]]
        assert sum(int(row[1]) for row in tables["preempted"]) == sum(e["kind"] == "preempt" for e in events["events"])
        lost: dict[str, float] = {}
        for e in events["events"]:
            if e["kind"] == "preempt":  # (all of them are kept: fewer than 200)
                lost[e["tenant"]] = lost.get(e["tenant"], 0.0) + e["time"] - e["started"]
        assert {p["tenant"]: p["work_lost"] for p in events["preempted"]} == lost
        assert {row[0]: float(row[2]) for row in tables["preempted"]} == lost
        assert [row[1] for row in tables["changes"]] == ["config accepted"]
        # The node reserved for l20 says so, first among the nodes.
        assert tables["nodes"][0][0] in nodes["reservation"]["nodes"] and "l20's task big" in tables["nodes"][0][4]
        # Starved tenants are tinted and say since when; the legend says what the tint means.
        starved = {t["tenant"]: t["starved_since"] for t in tenants_of() if t["starved_since"] is not None}
        shown = {row[0]: row[10] for row in tables["tenants"] if row[10] != "-"}
        assert starved and shown == {name: f"{since:g}" for name, since in starved.items()}
        assert "starved: below preemption_threshold" in driver.find_element("css selector", ".legend").text
        # The summary at the top says it first.
        summary = driver.find_element("id", "summary").text
        assert f"{len(starved)} tenants starved" in summary and "l20's task big" in summary, summary
        folder = artifacts_dir()
        driver.save_screenshot(str(folder / "page-laptop.png"))  # what the operator sees first
        full = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(LAPTOP[0], full + 200)
        driver.save_screenshot(str(folder / "page-laptop-full.png"))  # the whole page, at the same width
        assert (folder / "page-laptop.png").stat().st_size > 20_000
    finally:
        if driver is not None:
            driver.quit()
        worker.stop()
