"""The Kubernetes connector on a real control plane: etcd, kube-apiserver and kwok started by
``scripts/kube.sh`` (built with ``go`` from source, cached outside the checkout), with the worker
on the real Kafka and Redis of ``scripts/services.sh``. Nothing is mocked.

Each test has its own scheduler name, namespace, nodes (a label of its own, the connector's
``--node-selector``), cluster id, topic prefix and consumer group, so tests do not see each
other's pods or nodes. kwok runs a bound pod and ends it after the run time in its annotation.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fairstream.lab.kube_cluster import Cluster, bound_node, phase, scheduled_condition, start_control_plane, wait_until

from test_worker_live import BROKER, Worker

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def plane():
    subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "start"], check=True, capture_output=True)
    return start_control_plane()


@pytest.fixture(scope="module")
def cluster(plane):
    made = Cluster(plane)
    # The connector runs as the ServiceAccount of deploy/kubernetes/rbac.yaml, with exactly its rights.
    for name in ("namespace.yaml", "rbac.yaml"):
        made.apply_file(ROOT / "deploy" / "kubernetes" / name)
    return made


class Setup:
    """One test's names, and its worker and connector processes."""

    def __init__(self, cluster: Cluster, tmp_path: Path, nodes: int, policy: str = "drf", cpu: str = "4",
                 tenants: list[dict] | None = None, worker_args: tuple = (), connector_args: tuple = ()):
        self.id = uuid.uuid4().hex[:8]
        self.cluster, self.tmp_path = cluster, tmp_path
        self.scheduler = f"fairstream-{self.id}"
        self.namespace = cluster.make_namespace(f"t-{self.id}")
        self.node_names = cluster.make_nodes([f"n{k}-{self.id}" for k in range(nodes)], cpu=cpu,
                                             labels={"fairstream.dev/test": self.id})
        extra = list(worker_args)
        if tenants:
            path = tmp_path / "tenants.json"
            path.write_text(json.dumps({"tenants": tenants}))
            extra += ["--tenants", str(path)]
        self.worker = Worker(f"k{self.id}", tmp_path, "--policy", policy, "--resources", "cpu,mem",
                             "--explain-interval", "0.5", *extra)
        self.connector_args = connector_args
        self.connector = None

    def start(self):
        self.worker.start()
        self.worker.wait_for_log("worker.partitions_assigned")
        return self.start_connector()

    def start_connector(self):
        self.connector_log = self.tmp_path / f"connector-{time.monotonic_ns()}.log"
        self.connector = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "kubernetes", "--cluster", f"c{self.id}",
             "--kubeconfig", str(self.cluster.plane.connector_kubeconfig), "--scheduler-name", self.scheduler,
             "--node-selector", f"fairstream.dev/test={self.id}", "--broker", BROKER,
             "--topic-prefix", f"k{self.id}", "--worker-url", f"http://127.0.0.1:{self.worker.metrics_port}",
             "--heartbeat-interval", "1", "--explain-interval", "0.5", *self.connector_args],
            stdout=open(self.connector_log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
        wait_until(lambda: '"event": "kubernetes.started"' in self.connector_log.read_text()
                   or self.connector.poll() is not None, 60, "the connector to start")
        assert self.connector.poll() is None, self.connector_log.read_text()[-3000:]
        return self

    def pod(self, name, **kwargs):
        return self.cluster.make_pod(self.namespace, name, self.scheduler, **kwargs)

    def pods(self):
        return {p["metadata"]["name"]: p for p in self.cluster.pods(self.namespace)}

    def stop(self):
        if self.connector and self.connector.poll() is None:
            self.connector.terminate()
            try:
                self.connector.wait(20)
            except subprocess.TimeoutExpired:
                self.connector.kill()
        self.worker.stop()
        self.cluster.delete_namespace(self.namespace)
        self.cluster.delete_nodes(self.node_names)

    def logs(self) -> str:
        return self.connector_log.read_text()[-4000:]


@pytest.fixture
def setup(cluster, tmp_path):
    made = []

    def make(nodes, **kwargs):
        made.append(Setup(cluster, tmp_path, nodes, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.stop()


class BindOrder:
    """The order pods were bound in, read from a watch of the namespace (the test's own)."""

    def __init__(self, cluster: Cluster, namespace: str):
        import threading

        from lightkube.resources.core_v1 import Pod

        self.order: list[str] = []
        self.seen: set[str] = set()

        def watch():
            try:
                for _, pod in cluster.client.watch(Pod, namespace=namespace):
                    name = pod.metadata.name
                    if pod.spec.nodeName and name not in self.seen:
                        self.seen.add(name)
                        self.order.append(name)
            except Exception:  # (the API server restarted, or the test is over: nothing more to see)
                return

        threading.Thread(target=watch, daemon=True).start()


def test_bound_pods_follow_the_fair_share_of_queues_weighted_2_to_1(setup, cluster):
    # Three nodes of 4 cores: 12 pods of 1 core run at once. Queues a (weight 2) and b (weight 1)
    # each have 18 pods of 4 s waiting when the connector starts, so the worker's first pass
    # sees them all: drf gives a 2/3 of the 12 cores and b 1/3, 8 and 4 pods.
    test = setup(3, tenants=[{"id": "a", "weight": 2}, {"id": "b", "weight": 1}])
    order = BindOrder(cluster, test.namespace)
    for k in range(18):
        for queue in ("a", "b"):
            test.pod(f"{queue}-{k}", run_seconds=4, labels={"kueue.x-k8s.io/queue-name": queue})
    test.start()
    wait_until(lambda: len(order.order) >= 12, 60, "12 pods bound")
    first = order.order[:12]
    assert sum(name.startswith("a-") for name in first) == 8, first
    # Each queue's pods are taken in the order they were made (to the second, then by name).
    made = sorted(test.pods().values(), key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
    for queue, count in (("a", 8), ("b", 4)):
        in_line = [p["metadata"]["name"] for p in made if p["metadata"]["name"].startswith(f"{queue}-")][:count]
        assert sorted(n for n in first if n.startswith(f"{queue}-")) == sorted(in_line), (first, in_line)
    # A pod that waits says why where Kubernetes users look (PodScheduled=False, and an Event):
    # the worker's explanation of its place in line.
    said = wait_until(lambda: waiting_reason(test, "b-17"), 30, "b-17 to say why it waits")
    print(said)
    assert said["reason"] == "Waiting" and said["message"].startswith("fairstream: "), said
    # Every pod runs and ends; none is bound twice (a pod can be bound once) nor lost.
    wait_until(lambda: all(phase(p) == "Succeeded" for p in test.pods().values()) and len(test.pods()) == 36,
               120, "every pod Succeeded")
    assert len(order.order) == 36


def waiting_reason(test, name):
    pod = test.cluster.pod(test.namespace, name)
    condition = pod and scheduled_condition(pod)
    return condition if condition and condition.get("status") == "False" else None


@pytest.mark.parametrize("policy, late_queue_first", [("drf", 2), ("ltrf", 4)],
                         ids=["drf forgets: the late queue gets half of the freed room",
                              "ltrf pays the late queue back: all the freed room"])
def test_under_ltrf_a_queue_that_arrived_late_is_paid_back(setup, cluster, policy, late_queue_first):
    # A small Table 1 (LTRF paper): one node of 4 cores. b has it alone (4 pods of 6 s); 3 s in,
    # a arrives with 4 pods and b sends 4 more (each 1 core, 3 s). When b's first pods end at
    # about 6 s, 4 cores free up. drf, memoryless, splits them 2:2 between the equal queues;
    # ltrf orders by accumulated usage (b about 4 x 6 = 24 core-s, a 0; quantum 1 s charges a
    # 1 core-s per pod placed), so all 4 go to a.
    test = setup(1, policy=policy, worker_args=("--param", "resource=cpu", "--param", "quantum=1")
                 if policy == "ltrf" else ())
    order = BindOrder(cluster, test.namespace)
    test.start()
    for k in range(4):
        test.pod(f"b-early-{k}", run_seconds=6, labels={"kueue.x-k8s.io/queue-name": "b"})
    wait_until(lambda: len(order.order) == 4, 30, "b's first pods bound")
    time.sleep(3)  # (usage accumulates: b's share of the past)
    for k in range(4):
        test.pod(f"a-{k}", run_seconds=3, labels={"kueue.x-k8s.io/queue-name": "a"})
        test.pod(f"b-late-{k}", run_seconds=3, labels={"kueue.x-k8s.io/queue-name": "b"})
    wait_until(lambda: len(order.order) >= 8, 60, "the freed room given")
    contended = order.order[4:8]
    assert sum(name.startswith("a-") for name in contended) == late_queue_first, order.order
    wait_until(lambda: all(phase(p) == "Succeeded" for p in test.pods().values()), 60, "every pod Succeeded")


def test_preemption_evicts_for_a_starved_queue_and_honours_a_pod_disruption_budget(setup, cluster):
    # One node of 4 cores; a runs 4 long pods. b (equal weight) sends 2: after the preemption
    # timeout (2 s) b is starved below its fair share (2 of 4 cores), so the worker preempts 2 of
    # a's pods, the youngest. A PodDisruptionBudget covering a's pods refuses the evictions:
    # they run on, and b's pods wait for their room (held, not bound onto a full node), saying
    # so. With the budget gone, the evictions go through and b's pods are bound.
    from lightkube.resources.policy_v1 import PodDisruptionBudget

    test = setup(1, worker_args=("--param", "preemption=on", "--param", "preemption_timeout=2"))
    test.start()
    for k in range(4):
        test.pod(f"a-{k}", run_seconds=600, labels={"kueue.x-k8s.io/queue-name": "a", "app": "a"})
    wait_until(lambda: sum(bool(bound_node(p)) for p in test.pods().values()) == 4, 30, "a's pods bound")
    cluster.client.create(PodDisruptionBudget.from_dict({
        "metadata": {"name": "a-budget", "namespace": test.namespace},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "a"}}}}))
    for k in range(2):
        test.pod(f"b-{k}", run_seconds=600, labels={"kueue.x-k8s.io/queue-name": "b"})
    wait_until(lambda: '"event": "kubernetes.eviction_refused"' in test.connector_log.read_text(), 60,
               "an eviction refused by the budget")
    time.sleep(3)  # (the evictions are tried again meanwhile: still refused)
    pods = test.pods()
    assert all(phase(pods[f"a-{k}"]) == "Running" for k in range(4))
    assert not any(bound_node(pods[f"b-{k}"]) for k in range(2))
    held = wait_until(lambda: waiting_reason(test, "b-0"), 30, "b-0 to say why it waits")
    assert held["reason"] == "WaitingForRoom", (held, cluster.events(test.namespace, "b-0"), test.logs())
    refused = [e for k in range(4) for e in cluster.events(test.namespace, f"a-{k}") if e["reason"] == "EvictionRefused"]
    assert len(refused) == 2, refused  # the two youngest, preempted
    cluster.client.delete(PodDisruptionBudget, "a-budget", namespace=test.namespace)
    wait_until(lambda: all(bound_node(test.pods().get(f"b-{k}") or {}) for k in range(2)), 90, "b's pods bound")
    pods = test.pods()
    assert sum(phase(pods.get(f"a-{k}")) == "Running" for k in range(4)) == 2


def test_node_selectors_are_kept_and_a_pod_no_node_can_hold_says_so(setup, cluster):
    # Two nodes of 4 cores, one labelled disk=ssd. Four pods that need disk=ssd all go there, the
    # other node empty as it is; a pod of 64 cores, one that needs gpu=yes (no such node), and one
    # asking for a resource the worker does not schedule each wait and say why.
    test = setup(2)
    cluster.client.patch(__import__("lightkube.resources.core_v1", fromlist=["Node"]).Node, test.node_names[1],
                         {"metadata": {"labels": {"disk": "ssd"}}})
    test.start()
    for k in range(4):
        test.pod(f"ssd-{k}", run_seconds=600, node_selector={"disk": "ssd"})
    test.pod("huge", cpu="64")
    test.pod("gpu", node_selector={"gpu": "yes"})
    test.pod("fpga", extra={"example.com/fpga": "1"})
    test.pod("estimated", run_seconds=600, annotations={"fairstream.dev/estimate": "soon"})
    wait_until(lambda: sum(bool(bound_node(p)) for p in test.pods().values()) == 5, 30, "the ssd pods bound")
    pods = test.pods()
    assert {bound_node(pods[f"ssd-{k}"]) for k in range(4)} == {test.node_names[1]}
    for name, reason, words in [("huge", "Unschedulable", "large enough"), ("gpu", "Unschedulable", "gpu"),
                                ("fpga", "Unsupported", "example.com/fpga")]:
        said = wait_until(lambda: waiting_reason(test, name), 30, f"{name} to say why it waits")  # noqa: B023 (called before the loop moves on)
        assert said["reason"] == reason and words in said["message"], said
        assert any(e["reason"] == reason for e in cluster.events(test.namespace, name))
    assert bound_node(pods["estimated"]), "a bad estimate is a warning, not a reason to wait"
    assert any(e["reason"] == "InvalidEstimate" and e["type"] == "Warning"
               for e in cluster.events(test.namespace, "estimated"))


def test_a_pod_group_starts_whole_once_its_min_count_of_pods_exist_even_across_nodes(setup, cluster):
    # Two nodes of 4 cores. A PodGroup of the gang policy, minCount 3, of pods of 2 cores: no node
    # holds all three, so the gang spans both. Two pods alone wait (WaitingForGang, saying how
    # many of the 3 exist) and none is bound; the third makes the gang, and all three are bound,
    # each marked with its task of the gang's request. A Kueue pod group (its label and
    # pod-group-total-count 2) then goes the same way on the room left.
    test = setup(2)
    test.start()
    cluster.make_podgroup(test.namespace, "train", 3)
    for k in range(2):
        test.pod(f"w-{k}", cpu="2", run_seconds=600, pod_group="train")
    for k in range(2):
        said = wait_until(lambda: waiting_reason(test, f"w-{k}"), 30, f"w-{k} to say why it waits")  # noqa: B023 (called at once)
        assert said["reason"] == "WaitingForGang" and "2 of the 3 that must start together" in said["message"], said
    assert not any(bound_node(p) for p in test.pods().values())
    test.pod("w-2", cpu="2", run_seconds=600, pod_group="train")
    wait_until(lambda: all(bound_node(p) for p in test.pods().values()), 60, "the gang bound", every=0.5)
    pods = test.pods()
    assert len({bound_node(p) for p in pods.values()}) == 2
    marks = [json.loads(p["metadata"]["annotations"]["fairstream.dev/gang"]) for p in pods.values()]
    assert sorted(m["index"] for m in marks) == [0, 1, 2] and {(m["count"], m["min"]) for m in marks} == {(3, 3)}
    for k in range(2):
        test.pod(f"k-{k}", cpu="1", run_seconds=600, labels={"kueue.x-k8s.io/pod-group-name": "eval"},
                 annotations={"kueue.x-k8s.io/pod-group-total-count": "2"})
    wait_until(lambda: all(bound_node(test.pods().get(f"k-{k}") or {}) for k in range(2)), 60,
               "the Kueue pod group bound", every=0.5)


def test_kill_9_of_the_connector_and_of_the_worker_mid_run_binds_every_pod_once(setup, cluster):
    # 40 pods of 2 s on two nodes of 4 cores (8 at a time): kill -9 the connector after 8 are
    # bound, start it again; kill -9 the worker after 16, start it again. Every pod is bound once
    # (a pod can be bound once: the second Binding of a restart finds it bound to the same node)
    # and runs to the end; the worker placed each task once (decisions republished after its
    # restart keep their ids).
    test = setup(2)
    order = BindOrder(cluster, test.namespace)
    for k in range(40):
        test.pod(f"p-{k:02}", run_seconds=2, labels={"kueue.x-k8s.io/queue-name": "ab"[k % 2]})
    test.start()
    wait_until(lambda: len(order.order) >= 8, 60, "8 pods bound")
    test.connector.send_signal(signal.SIGKILL)
    test.connector.wait()
    test.start_connector()
    wait_until(lambda: len(order.order) >= 16, 60, "16 pods bound")
    test.worker.kill9()
    test.worker.start()
    wait_until(lambda: all(phase(p) == "Succeeded" for p in test.pods().values()), 180, "every pod Succeeded")
    assert sorted(order.order) == sorted(test.pods()) and len(order.order) == 40
    assert '"why": "bound_elsewhere"' not in test.connector_log.read_text()


def test_a_node_deleted_is_lost_and_its_pods_are_requeued_as_the_engine_does(setup, cluster):
    # Two nodes of 4 cores, 6 long pods: 4 fill one node, 2 the other (drf's order). n0 is
    # deleted: the connector says it is lost, the worker requeues the tasks that ran there, and
    # the connector deletes their pods (as Kubernetes' pod garbage collector does for a node
    # that is gone); their controller, if any, would make new ones. The other node's run on.
    test = setup(2)
    for k in range(6):
        test.pod(f"p-{k}", run_seconds=600)
    test.start()
    wait_until(lambda: sum(bool(bound_node(p)) for p in test.pods().values()) == 6, 30, "6 pods bound")
    on = {}
    for name, pod in test.pods().items():
        on.setdefault(bound_node(pod), set()).add(name)
    lost = test.node_names[0]
    assert on.get(lost), on
    cluster.delete_nodes([lost])
    wait_until(lambda: not (on[lost] & set(test.pods())), 30, f"the pods of {lost} deleted")
    assert set(test.pods()) == on.get(test.node_names[1], set())
    assert all(phase(p) == "Running" for p in test.pods().values())
    assert test.logs().count('"event": "kubernetes.deleted"') == len(on[lost])


def test_a_pod_deleted_while_the_connector_is_down_is_withdrawn_when_it_is_back(setup, cluster):
    # One node of 1 core: p0 runs, p1 waits. The connector is killed; p1 is deleted meanwhile.
    # Our finalizer keeps p1 (Terminating) until the connector is back, sends its completion
    # ('killed': the worker withdraws the waiting task) and takes the finalizer off.
    import urllib.request

    test = setup(1, cpu="1")
    test.start()
    test.pod("p0", run_seconds=600)
    test.pod("p1", run_seconds=600)
    wait_until(lambda: waiting_reason(test, "p1"), 30, "p1 to wait")
    test.connector.send_signal(signal.SIGKILL)
    test.connector.wait()
    from lightkube.resources.core_v1 import Pod

    cluster.client.delete(Pod, "p1", namespace=test.namespace)
    time.sleep(1)
    assert test.cluster.pod(test.namespace, "p1")["metadata"].get("deletionTimestamp")  # kept: Terminating
    test.start_connector()
    wait_until(lambda: test.cluster.pod(test.namespace, "p1") is None, 30, "p1 gone")
    url = f"http://127.0.0.1:{test.worker.metrics_port}/v1/clusters/c{test.id}/pending"

    def nothing_waits():
        return json.load(urllib.request.urlopen(url, timeout=5))["entries_total"] == 0

    wait_until(nothing_waits, 30, "the worker to have nothing waiting")


def test_an_api_server_away_for_a_while_is_waited_for(setup, cluster):
    # The API server stops (scripts/kube.sh stop-apiserver) and comes back (start): the
    # connector logs that its watches broke and lists again; pods made afterwards are bound.
    test = setup(1)
    test.start()
    test.pod("before", run_seconds=600)
    wait_until(lambda: bound_node(test.pods()["before"]), 30, "the first pod bound")
    subprocess.run(["bash", str(ROOT / "scripts" / "kube.sh"), "stop-apiserver"], check=True, capture_output=True)
    try:
        wait_until(lambda: '"event": "kubernetes.watch_broken"' in test.connector_log.read_text(), 30,
                   "the connector to see the API server go")
        time.sleep(5)
        assert test.connector.poll() is None, test.logs()
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "kube.sh"), "start"], check=True, capture_output=True)
    test.pod("after", run_seconds=600)
    wait_until(lambda: bound_node(test.pods().get("after") or {}), 60, "a pod made afterwards bound")


NEEDED = [("get", "nodes", ""), ("list", "nodes", ""), ("watch", "nodes", ""), ("get", "pods", ""),
          ("list", "pods", ""), ("watch", "pods", ""), ("patch", "pods", ""), ("delete", "pods", ""),
          ("create", "pods", "binding"), ("create", "pods", "eviction"), ("patch", "pods", "status"),
          ("create", "events", ""), ("list", "podgroups", ""), ("watch", "podgroups", "")]
NOT_NEEDED = [("create", "pods", ""), ("update", "pods", ""), ("update", "pods", "status"), ("delete", "nodes", ""),
              ("patch", "nodes", ""), ("get", "secrets", ""), ("list", "configmaps", ""), ("delete", "events", ""),
              ("create", "poddisruptionbudgets", ""), ("create", "podgroups", ""), ("patch", "podgroups", "")]


def test_the_deploy_manifests_pass_a_server_side_dry_run_and_the_role_grants_exactly_what_the_connector_does(cluster):
    # Every manifest of deploy/kubernetes/ applied with a server-side dry run: the API server
    # validates and admits each as it would apply it (schema, defaults, RBAC escalation rules).
    from lightkube.resources.authorization_v1 import SubjectAccessReview

    applied = [obj for name in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
               for obj in cluster.apply_file(name, dry_run=True)]
    kinds = sorted(f"{type(obj).__name__}/{obj.metadata.name}" for obj in applied)
    assert kinds == ["ClusterRole/fairstream-connector", "ClusterRoleBinding/fairstream-connector",
                     "Deployment/fairstream-connector", "Deployment/fairstream-worker", "Namespace/fairstream",
                     "Service/fairstream-worker", "ServiceAccount/fairstream-connector"]
    # The live tests above run the connector as this ServiceAccount (scripts/kube.sh's token):
    # what it needs is granted, so they pass; here, that nothing else is.

    def allowed(verb, resource, subresource):
        review = SubjectAccessReview.from_dict({"spec": {
            "user": "system:serviceaccount:fairstream:fairstream-connector",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:fairstream", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource,
                                   "group": "scheduling.k8s.io" if resource == "podgroups" else "",
                                   "namespace": "default" if resource != "nodes" else ""}}})
        return cluster.client.create(review).status.allowed

    assert [n for n in NEEDED if not allowed(*n)] == []
    assert [n for n in NOT_NEEDED if allowed(*n)] == []


def test_credentials_the_api_server_refuses_are_one_line(cluster, tmp_path):
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(cluster.plane.connector_kubeconfig.read_text().replace("fairstream-test-connector-token", "wrong"))
    done = subprocess.run([sys.executable, "-m", "fairstream.cli", "kubernetes", "--kubeconfig", str(bad),
                           "--broker", BROKER, "--topic-prefix", f"k{uuid.uuid4().hex[:8]}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "fairstream: error: the Kubernetes API server refused: Unauthorized (check the kubeconfig's credentials, "
        "and that the ClusterRole of deploy/kubernetes/rbac.yaml is bound to them)")
