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
from test_worker_live import BROKER, REDIS, Worker, free_port

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
            for _, pod in cluster.client.watch(Pod, namespace=namespace):
                name = pod.metadata.name
                if pod.spec.nodeName and name not in self.seen:
                    self.seen.add(name)
                    self.order.append(name)

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
    # Every pod runs and ends; none is bound twice (a pod can be bound once) nor lost.
    wait_until(lambda: all(phase(p) == "Succeeded" for p in test.pods().values()) and len(test.pods()) == 36,
               120, "every pod Succeeded")
    assert len(order.order) == 36
