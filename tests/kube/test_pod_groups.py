"""Pod groups that start whole (kube/mirror.py; docs/kubernetes.md, "Pod groups"): a PodGroup of
the gang policy, or a Kueue pod group, becomes one gang's request once enough of its pods exist;
without an API server or Kafka."""

import json

import pytest

from fairstream.kube.mirror import Bind, ClusterMirror, Explain, Finalize, Publish
from fairstream.kube.translate import FINALIZER, GANG_ANNOTATION, KUEUE_GROUP_LABEL, KUEUE_GROUP_SIZE

from kube_builders import node, pod, podgroup


def sent(actions, kind=None):
    """The messages the actions send, each once: a gang's request rides on each of its pods'
    finalizer calls, and the connector sends it once, after them."""
    out = {}
    for action in actions:
        publish = action.then if isinstance(action, Finalize) else action
        if isinstance(publish, Publish) and (kind is None or publish.kind == kind):
            out[id(publish)] = publish.message
    return list(out.values())


def reasons(actions):
    return {(a.pod.name, a.reason) for a in actions if isinstance(a, Explain)}


def cluster(*podgroups, nodes=("n1", "n2")):
    mirror = ClusterMirror("prod")
    for name in nodes:
        mirror.node_seen(node(name, cpu="4", memory="8Gi"), 0.0)
    mirror.podgroups_listed(list(podgroups), 0.0)
    return mirror


def member(name, group="train", **kw):
    return pod(name, uid=f"{name}-uid", group=group, owner=("Job", "train"), **kw)


def kueue_member(name, total="3", **kw):
    annotations = {} if total is None else {KUEUE_GROUP_SIZE: total}
    return pod(name, uid=f"{name}-uid", labels={KUEUE_GROUP_LABEL: "train"}, annotations=annotations, **kw)


def marked(made, finalize):
    """``made`` as the API server has it after ``finalize`` (our finalizer and the gang's mark)."""
    made["metadata"]["finalizers"] = [FINALIZER]
    made["metadata"]["annotations"] = {**made["metadata"]["annotations"], **dict(finalize.annotations)}
    return made


@pytest.mark.parametrize("group_of, podgroups", [
    (member, [podgroup("train", 3)]),
    (kueue_member, []),
], ids=["a PodGroup of the gang policy with minCount 3",
        "a Kueue pod group of pod-group-total-count 3"])
def test_a_group_waits_until_its_size_of_pods_exist_then_goes_as_one_gang(group_of, podgroups):
    mirror = cluster(*podgroups)
    assert sent(mirror.pod_seen(group_of("w0"), 1.0)) == []
    said = mirror.pod_seen(group_of("w1"), 2.0)
    assert sent(said) == []
    assert reasons(said) == {("w0", "WaitingForGang"), ("w1", "WaitingForGang")}
    assert "2 of the 3 that must start together exist" in [a for a in said if isinstance(a, Explain)][0].message
    actions = mirror.pod_seen(group_of("w2"), 3.0)
    [request] = sent(actions)
    assert request["count"] == 3 and request["gang"] == {"min": 3}
    assert request["task"].startswith("default/train:gang/") and request["demand"] == {"cpu": 1.0, "mem": 0.0}
    # Each pod gets our finalizer and its mark in one call; the request goes after them.
    finalizes = [a for a in actions if isinstance(a, Finalize)]
    assert [(a.pod.name, a.add) for a in finalizes] == [("w0", True), ("w1", True), ("w2", True)]
    assert [json.loads(dict(a.annotations)[GANG_ANNOTATION])["index"] for a in finalizes] == [0, 1, 2]
    assert {id(a.then) for a in finalizes} == {id(finalizes[0].then)}
    assert [mirror.pods[f"w{k}-uid"].task for k in range(3)] == [f"{request['task']}-{k}" for k in range(3)]


def test_its_placements_bind_each_pod_and_a_pod_that_comes_once_the_gang_runs_goes_alone():
    mirror = cluster(podgroup("train", 2))
    mirror.pod_seen(member("w0"), 1.0)
    [request] = sent(mirror.pod_seen(member("w1"), 1.0))
    gang = request["task"]
    binds = mirror.decision({"id": "d1", "cluster": "prod", "kind": "place", "task": f"{gang}-0", "count": 2,
                             "tasks": [f"{gang}-0", f"{gang}-1"], "node": "n1"}, 2.0)
    assert [(a.pod.name, a.node) for a in binds if isinstance(a, Bind)] == [("w0", "n1"), ("w1", "n1")]
    for k in range(2):  # (the API server says they are bound)
        mirror.pod_seen(member(f"w{k}", node="n1", phase="Running"), 3.0)
    # A worker made again (its first one failed) joins a gang that runs: it goes on its own.
    mirror.pod_seen(member("w0", node="n1", phase="Failed"), 4.0)
    [alone] = sent(mirror.pod_seen(member("w2"), 5.0), "submitted")
    assert alone["task"] == "default/w2/w2-uid" and "gang" not in alone and "count" not in alone


def test_a_pod_deleted_before_its_gang_starts_withdraws_the_whole_request_and_the_rest_wait_again():
    mirror = cluster(podgroup("train", 3))
    for k in range(2):
        mirror.pod_seen(member(f"w{k}"), 1.0)
    [first] = sent(mirror.pod_seen(member("w2"), 1.0))
    gone = mirror.pod_gone(member("w1"), 2.0)
    # Every task of the request is withdrawn (the deleted pod's own completion, and the others').
    assert sorted((m["task"], m["status"]) for m in sent(gone, "completed")) == [
        (f"{first['task']}-{k}", "killed") for k in range(3)]
    assert reasons(gone) == {("w0", "WaitingForGang"), ("w2", "WaitingForGang")}
    assert mirror.counts.gangs_withdrawn == 1
    # The Job's new pod completes the group again: a new request, of another id.
    [again] = sent(mirror.pod_seen(member("w3"), 3.0), "submitted")
    assert again["task"] != first["task"] and again["count"] == 3
    assert [mirror.pods[u].task for u in ("w0-uid", "w2-uid", "w3-uid")] == [f"{again['task']}-{k}" for k in range(3)]


def test_more_pods_than_the_minimum_all_go_in_the_request_and_later_ones_wait_for_it_to_start():
    mirror = cluster(podgroup("train", 2))
    mirror.pod_seen(member("w0"), 1.0)
    [request] = sent(mirror.pod_seen(member("w1"), 1.0))
    assert (request["count"], request["gang"]) == (2, {"min": 2})
    late = mirror.pod_seen(member("w2"), 2.0)
    assert sent(late) == [] and reasons(late) == {("w2", "WaitingForGang")}
    binds = mirror.decision({"id": "d1", "cluster": "prod", "kind": "place", "task": f"{request['task']}-0",
                             "count": 2, "tasks": [f"{request['task']}-{k}" for k in range(2)], "node": "n1"}, 3.0)
    assert [m["task"] for m in sent(binds, "submitted")] == ["default/w2/w2-uid"]  # (its gang runs: alone)


@pytest.mark.parametrize("podgroups, expected", [
    ([podgroup("train")], "one by one"),
    ([], "WaitingForPodGroup"),
], ids=["a PodGroup of the basic policy: its pods go one by one",
        "a PodGroup not seen yet: its pods wait for it"])
def test_a_basic_podgroup_and_one_not_yet_made(podgroups, expected):
    mirror = cluster(*podgroups)
    actions = mirror.pod_seen(member("w0"), 1.0)
    if expected == "one by one":
        assert [m["task"] for m in sent(actions)] == ["default/w0/w0-uid"]
    else:
        assert sent(actions) == [] and reasons(actions) == {("w0", expected)}
        mirror.pod_seen(member("w1"), 1.0)
        [request] = sent(mirror.podgroup_seen(podgroup("train", 2), 2.0))  # (made: they go)
        assert request["count"] == 2


@pytest.mark.parametrize("second, why", [
    (dict(cpu="2"), "ask for different resources"),
    (dict(labels={"kueue.x-k8s.io/queue-name": "other"}), "ask for different queues"),
], ids=["pods of different demand: a gang is of one shape", "pods of different queues"])
def test_a_group_fairstream_cannot_start_whole_says_why_on_each_pod(second, why):
    mirror = cluster(podgroup("train", 2))
    mirror.pod_seen(member("w0"), 1.0)
    labels = second.pop("labels", {})
    made = member("w1", **second)
    made["metadata"]["labels"].update(labels)
    actions = mirror.pod_seen(made, 1.0)
    assert sent(actions) == [] and reasons(actions) == {("w0", "Unsupported"), ("w1", "Unsupported")}
    assert all(why in a.message for a in actions)


def test_a_kueue_pod_group_without_its_total_count_says_so():
    mirror = cluster()
    [said] = mirror.pod_seen(kueue_member("w0", total=None), 1.0)
    assert said.reason == "Unsupported" and KUEUE_GROUP_SIZE in said.message


def test_a_gang_waiting_is_told_why_on_each_of_its_pods():
    mirror = cluster(podgroup("train", 2))
    mirror.pod_seen(member("w0"), 1.0)
    [request] = sent(mirror.pod_seen(member("w1"), 1.0))
    entry = {"id": request["task"], "first": f"{request['task']}-0", "tasks": 2, "reason": "gang",
             "message": "gang of 2 needs 1 more cpu"}
    assert reasons(mirror.pending_reasons([entry])) == {("w0", "Waiting"), ("w1", "Waiting")}


def gang_made(size=3):
    """A mirror that made a gang's request of ``size`` pods; the pods as the API server then has
    them (finalizer and mark on each), and the request."""
    mirror = cluster(podgroup("train", size))
    actions = []
    for k in range(size):
        actions += mirror.pod_seen(member(f"w{k}"), 1.0)
    [request] = sent(actions)
    finalizes = {a.pod.name: a for a in actions if isinstance(a, Finalize)}
    return [marked(member(f"w{k}"), finalizes[f"w{k}"]) for k in range(size)], request


def restarted(pods):
    mirror = cluster(podgroup("train", 3))
    return mirror, mirror.pods_listed(pods, 9.0)


def test_after_a_restart_a_gang_still_waiting_is_submitted_again_under_the_same_id():
    pods, request = gang_made()
    mirror, actions = restarted(pods)
    [again] = sent(actions)  # (the worker refuses it as a duplicate if it has it)
    assert {k: again[k] for k in ("task", "count", "gang")} == {k: request[k] for k in ("task", "count", "gang")}
    assert [mirror.pods[f"w{k}-uid"].task for k in range(3)] == [f"{request['task']}-{k}" for k in range(3)]


def test_after_a_restart_a_gang_that_started_sends_nothing_and_its_pods_end_as_its_tasks():
    pods, request = gang_made()
    pods[0]["spec"]["nodeName"], pods[0]["status"]["phase"] = "n1", "Running"
    mirror, actions = restarted(pods)
    assert sent(actions, "submitted") == []
    ended = {**pods[0], "status": {"phase": "Succeeded"}}
    assert [m["task"] for m in sent(mirror.pod_seen(ended, 10.0), "completed")] == [f"{request['task']}-0"]


def test_after_a_restart_a_gang_missing_a_pod_is_withdrawn_and_its_pods_wait_again():
    pods, request = gang_made()
    mirror, actions = restarted(pods[:2])  # (w2 went unseen: --no-finalizer, or deleted by hand)
    assert sorted(m["task"] for m in sent(actions, "completed")) == [f"{request['task']}-{k}" for k in range(3)]
    assert sent(actions, "submitted") == []
    assert reasons(actions) == {("w0", "WaitingForGang"), ("w1", "WaitingForGang")}


def test_the_connector_sends_a_gangs_request_once_after_its_pods_finalizer_calls():
    # The request rides on each pod's call (whichever pod's call succeeds sends it): the
    # connector sends it once, after them all. (An API server and a topic that record calls.)
    import asyncio

    from fairstream.kube.connector import Connector, ConnectorConfig

    class Api:
        def __init__(self):
            self.calls = []

        async def finalizer(self, pod, add, annotations):
            self.calls.append((pod.name, add, sorted(annotations)))
            return True

    class Topics:
        def __init__(self):
            self.sent = []

        async def send_many(self, topic, messages):
            self.sent += [(topic, m["task"]) for m in messages]

    connector = Connector(ConnectorConfig("prod"))
    connector.mirror = cluster(podgroup("train", 3))
    connector.api, connector.publisher = Api(), Topics()
    actions = []
    for k in range(3):
        actions += connector.mirror.pod_seen(member(f"w{k}"), 1.0)
    asyncio.run(connector.apply(actions))
    assert connector.api.calls == [(f"w{k}", True, [GANG_ANNOTATION]) for k in range(3)]
    [(topic, task)] = connector.publisher.sent
    assert topic.endswith("tasks.submitted") and task.startswith("default/train:gang/")


def test_a_gang_the_cluster_can_never_hold_whole_says_so_on_each_of_its_pods():
    mirror = cluster(podgroup("train", 2))
    mirror.pod_seen(member("w0", cpu="5"), 1.0)  # (no node of 4 cores holds one)
    [request] = sent(mirror.pod_seen(member("w1", cpu="5"), 1.0))
    said = mirror.decision({"id": "u1", "cluster": "prod", "kind": "unschedulable", "task": request["task"],
                            "node": "", "reason": "gang of 2 never starts whole"}, 2.0)
    assert reasons(said) == {("w0", "Unschedulable"), ("w1", "Unschedulable")}
