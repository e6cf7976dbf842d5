"""Pods and nodes to wire events: Kubernetes' quantities, its rule for a pod's requests, tenants,
jobs and constraints (kube/translate.py). Pure: no API server."""

from fractions import Fraction

import pytest

from fairstream.kube.translate import (
    Untranslatable,
    capacity_of,
    constraints_of,
    demand_of,
    job_of,
    parse_estimate,
    parse_quantity,
    pod_requests,
    submission,
    tenant_of,
)

from kube_builders import container, node, pod


@pytest.mark.parametrize("text, exact", [
    ("100m", Fraction(1, 10)),
    ("2", Fraction(2)),
    ("0.5", Fraction(1, 2)),
    ("1.5Gi", Fraction(3 * 2**29)),
    ("64Mi", Fraction(64 * 2**20)),
    ("1Ki", Fraction(1024)),
    ("1k", Fraction(1000)),
    ("1G", Fraction(10**9)),
    ("1e3", Fraction(1000)),
    ("5E-1", Fraction(1, 2)),  # an exponent, not exa
    ("1E", Fraction(10**18)),  # exa
    ("250u", Fraction(1, 4000)),
    (".5", Fraction(1, 2)),
], ids=lambda v: str(v))
def test_a_quantity_is_read_exactly(text, exact):
    assert parse_quantity(text) == exact


@pytest.mark.parametrize("text", ["", "1.5 Gi", "1Gb", "abc", "1m5", "1e999999999", None, [1]])
def test_a_quantity_that_is_not_one_says_so(text):
    with pytest.raises(Untranslatable, match="not a quantity|out of range"):
        parse_quantity(text)


@pytest.mark.parametrize("spec, expected", [
    pytest.param({"containers": [container(cpu="500m", memory="1Gi"), container(cpu="250m", memory="512Mi")]},
                 {"cpu": Fraction(3, 4), "memory": Fraction(3 * 2**29)}, id="the containers' requests are summed"),
    pytest.param({"containers": [container(cpu="500m")], "initContainers": [container(cpu="2")]},
                 {"cpu": Fraction(2)}, id="at least the largest init container's"),
    # A sidecar (restartPolicy Always) runs beside the containers and the init containers after
    # it: 0.5 + 0.25 = 0.75 for the containers; 0.25 + 1 = 1.25 while the second init runs.
    pytest.param({"containers": [container(cpu="500m")],
                  "initContainers": [container(cpu="250m", restartPolicy="Always"), container(cpu="1")]},
                 {"cpu": Fraction(5, 4)}, id="sidecars count beside the containers and the inits after them"),
    pytest.param({"containers": [container(cpu="500m")], "overhead": {"cpu": "100m"}},
                 {"cpu": Fraction(6, 10)}, id="plus the pod's overhead"),
    pytest.param({"containers": [{"name": "c", "image": "x"}]}, {}, id="no requests: none"),
])
def test_a_pods_requests_follow_kubernetes_rule(spec, expected):
    assert pod_requests(spec) == expected


def test_demand_is_in_the_workers_units_cores_and_mib_and_extended_resources_by_name():
    spec = {"containers": [container(cpu="250m", memory="1.5Gi", **{"nvidia.com/gpu": "2", "ephemeral-storage": "1Gi"})]}
    assert demand_of(spec, ("cpu", "mem", "nvidia.com/gpu")) == {"cpu": 0.25, "mem": 1536.0, "nvidia.com/gpu": 2.0}
    # ephemeral-storage is not scheduled: left out. An extended resource not scheduled stops it.
    with pytest.raises(Untranslatable, match="requests nvidia.com/gpu, which this scheduler does not schedule"):
        demand_of(spec, ("cpu", "mem"))


def test_a_nodes_capacity_is_its_allocatable_in_the_workers_units():
    assert capacity_of(node("n1", cpu="7900m", memory="31Gi", pods="110"), ("cpu", "mem")) == {"cpu": 7.9, "mem": 31744.0}


@pytest.mark.parametrize("labels, namespace, tenant", [
    ({"kueue.x-k8s.io/queue-name": "team-a"}, "ns", "team-a"),
    ({}, "team-b", "team-b"),
], ids=["the queue label names the tenant", "else the namespace"])
def test_the_tenant(labels, namespace, tenant):
    assert tenant_of(pod("p", namespace=namespace, labels=labels)) == tenant


@pytest.mark.parametrize("made, job", [
    (pod("p", labels={"fairstream.dev/job": "train"}), "default/train"),
    (pod("p", labels={"jobset.sigs.k8s.io/jobset-name": "js"}), "default/JobSet/js"),
    (pod("p", owner=("Job", "j1")), "default/Job/j1"),
    (pod("p", uid="abcdef0123456789"), "default/p/abcdef01"),
], ids=["the job label", "a JobSet's name", "its controller", "else the pod alone"])
def test_the_job(made, job):
    assert job_of(made) == job


@pytest.mark.parametrize("spec, expected", [
    pytest.param({"nodeSelector": {"disk": "ssd"}}, {"labels": {"disk": "ssd"}}, id="nodeSelector is required labels"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}},
        {"labels": {"zone": ["a", "b"]}}, id="required affinity In is one of the values"),
    pytest.param({"nodeSelector": {"zone": "a"}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}},
        {"labels": {"zone": "a"}}, id="both must hold"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2", "n1"]}]}]}}}},
        {"nodes": ["n1", "n2"]}, id="a node name In is an allow-list"),
    pytest.param({}, None, id="none"),
])
def test_constraints(spec, expected):
    assert constraints_of(spec) == expected


@pytest.mark.parametrize("spec, why", [
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}}}, "only In is supported"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]},
        {"matchExpressions": [{"key": "b", "operator": "In", "values": ["1"]}]}]}}}}, "several nodeSelectorTerms"),
    ({"nodeSelector": {"zone": "c"}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
     "exclude each other"),
], ids=["NotIn", "several terms", "contradicting"])
def test_constraints_that_cannot_be_expressed_say_why(spec, why):
    with pytest.raises(Untranslatable, match=why):
        constraints_of(spec)


@pytest.mark.parametrize("text, seconds", [("90", 90.0), ("1.5", 1.5), ("90s", 90.0), ("1h30m", 5400.0),
                                           ("250ms", 0.25)])
def test_an_estimate_is_seconds_or_a_duration(text, seconds):
    assert parse_estimate(text) == seconds


def test_a_pod_becomes_a_submission_and_a_bad_estimate_is_a_warning_not_a_loss():
    made = submission(pod("p", uid="0123456789ab", labels={"kueue.x-k8s.io/queue-name": "q"}, owner=("Job", "j"),
                          annotations={"fairstream.dev/estimate": "soon"}, node_selector={"disk": "ssd"},
                          containers=[container(cpu="1", memory="2Gi")]),
                      "prod", 12.5, ("cpu", "mem"))
    assert made.message == {"cluster": "prod", "task": "default/p/01234567", "job": "default/Job/j", "tenant": "q",
                            "demand": {"cpu": 1.0, "mem": 2048.0}, "time": 12.5,
                            "constraints": {"labels": {"disk": "ssd"}}}
    assert made.warnings == ["fairstream.dev/estimate='soon': not a duration (seconds, or e.g. 90s, 1h30m): ignored, "
                             "the pod is scheduled without an estimate"]


def test_a_pod_without_requests_asks_for_a_millicore():
    made = submission(pod("p", containers=[{"name": "c", "image": "x"}]), "prod", 0.0, ("cpu", "mem"))
    assert made.message["demand"] == {"cpu": 0.001, "mem": 0.0}
