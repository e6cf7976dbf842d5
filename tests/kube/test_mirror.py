"""The connector's rules (kube/mirror.py), without an API server or Kafka: what each pod, node
and decision asks of it."""

import pytest

from fairstream.kube.mirror import Bind, ClusterMirror, DeletePod, Evict, Explain, Finalize, Publish
from fairstream.kube.translate import FINALIZER

from kube_builders import node, pod


def messages(actions, kind=None):
    """The messages the actions send (a submission sent once its pod has our finalizer too)."""
    sent = [a.then if isinstance(a, Finalize) else a for a in actions]
    return [a.message for a in sent if isinstance(a, Publish) and (kind is None or a.kind == kind)]


def calls(actions):
    return [a for a in actions if not isinstance(a, (Publish, Finalize))]


def with_finalizer(made):
    made["metadata"]["finalizers"] = [FINALIZER]
    return made


def mirror_with_nodes(*names, **allocatable):
    mirror = ClusterMirror("prod")
    for name in names:
        mirror.node_seen(node(name, **(allocatable or {"cpu": "4", "memory": "8Gi"})), 0.0)
    return mirror


def place(task, node_name, ident="d1", kind="place"):
    return {"id": ident, "cluster": "prod", "kind": kind, "task": task, "node": node_name}


def test_a_waiting_pod_of_ours_is_submitted_once_and_another_schedulers_is_not():
    mirror = mirror_with_nodes("n1")
    ours, theirs = pod("a", uid="aaaaaaaa-1"), pod("b", uid="bbbbbbbb-1", scheduler="default-scheduler")
    submitted = messages(mirror.pod_seen(ours, 1.0), "submitted")
    assert [m["task"] for m in submitted] == ["default/a/aaaaaaaa"]
    assert mirror.pod_seen(ours, 2.0) == []  # modified, still waiting: nothing more
    assert mirror.pod_seen(theirs, 2.0) == []


def test_pods_of_other_schedulers_on_a_node_take_its_room_from_the_heartbeat_at_once():
    mirror = mirror_with_nodes("n1")
    theirs = pod("b", scheduler="default-scheduler", node="n1", phase="Running", cpu="1500m", memory="1Gi")
    [beat] = messages(mirror.pod_seen(theirs, 1.0), "heartbeat")
    # 4 cores less 1.5; 8 GiB = 8,192 MiB less 1,024.
    assert beat["capacity"] == {"cpu": 2.5, "mem": 7168.0}
    [back] = messages(mirror.pod_gone(theirs, 2.0), "heartbeat")
    assert back["capacity"] == {"cpu": 4.0, "mem": 8192.0}


def test_a_placement_binds_the_pod_and_its_end_is_a_completion_once():
    mirror = mirror_with_nodes("n1")
    waiting = pod("a", uid="aaaaaaaa-1", cpu="1")
    mirror.pod_seen(waiting, 1.0)
    actions = mirror.decision(place("default/a/aaaaaaaa", "n1"), 2.0)
    assert calls(actions) == [Bind(mirror.pods["aaaaaaaa-1"].ref, "n1", "d1")]
    mirror.pod_seen({**waiting, "spec": {**waiting["spec"], "nodeName": "n1"}, "status": {"phase": "Running"}}, 3.0)
    done = {**waiting, "spec": {**waiting["spec"], "nodeName": "n1"}, "status": {"phase": "Failed"}}
    assert messages(mirror.pod_seen(done, 9.0)) == [
        {"cluster": "prod", "task": "default/a/aaaaaaaa", "time": 9.0, "status": "failed"}]
    assert mirror.pod_seen(done, 10.0) == [] and mirror.pod_gone(done, 11.0) == []


@pytest.mark.parametrize("bound", [False, True], ids=["waiting", "running"])
def test_a_pod_deleted_is_completed_as_killed(bound):
    mirror = mirror_with_nodes("n1")
    made = pod("a", uid="aaaaaaaa-1", node="n1" if bound else None, phase="Running" if bound else "Pending")
    mirror.pod_seen(made, 1.0)
    assert messages(mirror.pod_gone(made, 5.0)) == [
        {"cluster": "prod", "task": "default/a/aaaaaaaa", "time": 5.0, "status": "killed"}]


def test_a_bound_pod_listed_at_start_counts_as_running_not_as_waiting():
    mirror = mirror_with_nodes("n1")
    assert messages(mirror.pods_listed([with_finalizer(pod("a", node="n1", phase="Running"))], 1.0)) == []
    assert mirror.used["n1"] == [1.0, 0.0]


def test_a_submission_is_sent_once_the_pod_has_our_finalizer_and_again_after_a_restart():
    # The finalizer first: a pod deleted while the connector is down then stays (Terminating)
    # until the connector is back and says so. A restarted connector submits the waiting pods
    # with the finalizer again (the worker refuses what it knows as a duplicate).
    mirror = mirror_with_nodes("n1")
    made = pod("a", uid="aaaaaaaa-1")
    [first] = mirror.pod_seen(made, 1.0)
    assert isinstance(first, Finalize) and first.add and first.then.message["task"] == "default/a/aaaaaaaa"
    restarted = mirror_with_nodes("n1")
    assert [a.kind for a in restarted.pod_seen(with_finalizer(made), 2.0)] == ["submitted"]


@pytest.mark.parametrize("finalizer, sent", [(True, ["succeeded"]), (False, [])],
                         ids=["with our finalizer: its completion was not sent yet",
                              "without: it was (the finalizer comes off after)"])
def test_a_pod_that_ended_while_the_connector_was_down(finalizer, sent):
    mirror = mirror_with_nodes("n1")
    made = pod("a", node="n1", phase="Succeeded")
    actions = mirror.pods_listed([with_finalizer(made) if finalizer else made], 5.0)
    assert [m["status"] for m in messages(actions)] == sent
    assert [a.add for a in actions if isinstance(a, Finalize)] == ([False] if finalizer else [])


def test_a_pod_being_deleted_is_completed_at_once_but_keeps_its_room_until_it_is_gone():
    mirror = mirror_with_nodes("n1")
    running = with_finalizer(pod("v", uid="vvvvvvvv-1", node="n1", phase="Running", cpu="4"))
    mirror.pod_seen(running, 0.0)
    mirror.pod_seen(pod("w", uid="wwwwwwww-1", cpu="1"), 0.0)
    deleting = {**running, "metadata": {**running["metadata"], "deletionTimestamp": "2026-11-29T00:00:00Z"}}
    actions = mirror.pod_seen(deleting, 1.0)
    assert [m["status"] for m in messages(actions)] == ["killed"]
    assert [a.add for a in actions if isinstance(a, Finalize)] == [False]  # (after the completion is sent)
    held = mirror.decision(place("default/w/wwwwwwww", "n1"), 1.5)
    assert [a.reason for a in held] == ["WaitingForRoom"]  # held, not bound: v is still terminating
    assert calls(mirror.pod_gone(deleting, 2.0)) == [Bind(mirror.pods["wwwwwwww-1"].ref, "n1", "d1")]


def test_a_list_without_a_known_pod_says_it_is_gone():
    mirror = mirror_with_nodes("n1")
    mirror.pod_seen(pod("a", uid="aaaaaaaa-1"), 1.0)
    assert [m["status"] for m in messages(mirror.pods_listed([], 2.0))] == ["killed"]


def test_a_placement_waits_for_a_preempted_pod_to_leave_its_node_then_binds():
    # n1: 4 cores, all taken by the victim v (4 cores). The worker preempts v and places w there
    # at once; v still runs (terminating, or its eviction refused) until it is gone.
    mirror = mirror_with_nodes("n1")
    victim = pod("v", uid="vvvvvvvv-1", node="n1", phase="Running", cpu="4")
    mirror.pod_seen(victim, 0.0)
    mirror.pod_seen(pod("w", uid="wwwwwwww-1", cpu="2"), 1.0)
    evict = mirror.decision(place("default/v/vvvvvvvv", "n1", "d1", kind="preempt"), 2.0)
    assert calls(evict) == [Evict(mirror.pods["vvvvvvvv-1"].ref, "d1")]
    held = mirror.decision(place("default/w/wwwwwwww", "n1", "d2"), 2.0)
    assert [type(a) for a in held] == [Explain] and held[0].reason == "WaitingForRoom"
    assert mirror.held_decisions() == ["d2"]
    gone = mirror.pod_gone(victim, 3.0)
    assert messages(gone) == [{"cluster": "prod", "task": "default/v/vvvvvvvv", "time": 3.0, "status": "killed"}]
    assert calls(gone) == [Bind(mirror.pods["wwwwwwww-1"].ref, "n1", "d2")]
    assert mirror.held_decisions() == []


@pytest.mark.parametrize("state, count", [
    ("gone", "pod_gone"), ("ended", "pod_gone"), ("same node", "already_bound"), ("other node", "bound_elsewhere"),
])
def test_a_placement_that_cannot_be_carried_out_is_counted_never_retried(state, count):
    mirror = mirror_with_nodes("n1", "n2")
    made = pod("a", uid="aaaaaaaa-1")
    mirror.pod_seen(made, 0.0)
    if state == "gone":
        mirror.pod_gone(made, 1.0)
    elif state == "ended":
        mirror.pod_seen({**made, "status": {"phase": "Succeeded"}}, 1.0)
    else:
        mirror.pod_seen({**made, "spec": {**made["spec"], "nodeName": "n1" if state == "same node" else "n2"}}, 1.0)
    assert calls(mirror.decision(place("default/a/aaaaaaaa", "n1"), 2.0)) == []
    assert getattr(mirror.counts, count) == 1


def test_a_decision_seen_twice_is_carried_out_once():
    mirror = mirror_with_nodes("n1")
    mirror.pod_seen(pod("a", uid="aaaaaaaa-1"), 0.0)
    assert len(calls(mirror.decision(place("default/a/aaaaaaaa", "n1"), 1.0))) == 1
    assert mirror.decision(place("default/a/aaaaaaaa", "n1"), 1.0) == []
    assert mirror.counts.duplicate_decisions == 1


def test_a_requeue_deletes_the_pod_and_unschedulable_says_why_on_it():
    mirror = mirror_with_nodes("n1")
    mirror.pod_seen(pod("a", uid="aaaaaaaa-1", node="n1", phase="Running"), 0.0)
    mirror.pod_seen(pod("b", uid="bbbbbbbb-1", cpu="64"), 0.0)
    assert calls(mirror.decision(place("default/a/aaaaaaaa", "n1", "d1", kind="requeue"), 1.0)) == [
        DeletePod(mirror.pods["aaaaaaaa-1"].ref, "d1")]
    [said] = mirror.decision({**place("default/b/bbbbbbbb", None, "d2", kind="unschedulable"),
                              "reason": "unschedulable: no node is large enough"}, 1.0)
    assert (said.reason, said.message) == ("Unschedulable", "unschedulable: no node is large enough")


@pytest.mark.parametrize("change, expected", [
    (dict(unschedulable=True), {"cpu": 0.0, "mem": 0.0}),
    (dict(ready=False), {"cpu": 0.0, "mem": 0.0}),
    (dict(taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]), {"cpu": 0.0, "mem": 0.0}),
    (dict(taints=[{"key": "spot", "effect": "PreferNoSchedule"}]), {"cpu": 4.0, "mem": 8192.0}),
], ids=["cordoned: no room for anything new", "NotReady: the same, until lost",
        "tainted NoSchedule: the same (tolerations are not weighed)", "PreferNoSchedule: open"])
def test_a_closed_node_has_no_room_and_what_runs_there_stays(change, expected):
    mirror = mirror_with_nodes("n1")
    [beat] = messages(mirror.node_seen(node("n1", **change), 5.0)) or [{"capacity": {"cpu": 4.0, "mem": 8192.0}}]
    assert beat["capacity"] == expected and "lost" not in beat


def test_a_node_not_ready_too_long_or_deleted_is_lost_and_back_when_ready():
    mirror = ClusterMirror("prod", lost_after=300)
    mirror.node_seen(node("n1"), 0.0)
    mirror.node_seen(node("n2"), 0.0)
    mirror.node_seen(node("n1", ready=False), 10.0)
    assert all("lost" not in m for m in messages(mirror.heartbeats(309.0)))
    assert [m["node"] for m in messages(mirror.heartbeats(310.0)) if m.get("lost")] == ["n1"]
    assert messages(mirror.node_gone("n2", 311.0)) == [{"cluster": "prod", "node": "n2", "time": 311.0, "lost": True}]
    [back] = messages(mirror.node_seen(node("n1"), 400.0))
    assert back["capacity"] == {"cpu": 4.0, "mem": 8192.0}


def test_why_a_pod_waits_goes_onto_it_only_when_it_changed():
    mirror = mirror_with_nodes("n1")
    mirror.pod_seen(pod("a", uid="aaaaaaaa-1"), 0.0)
    entry = {"first": "default/a/aaaaaaaa", "tasks": 1, "reason": "behind_tenants",
             "message": "freed room goes first to team-b (its share 0.1 < yours 0.5)"}
    [said] = mirror.pending_reasons([entry])
    assert (said.reason, said.message) == ("Waiting", "fairstream: freed room goes first to team-b (its share 0.1 < yours 0.5)")
    assert mirror.pending_reasons([entry]) == []


def test_a_pod_that_cannot_be_expressed_waits_and_says_why_once():
    mirror = mirror_with_nodes("n1")
    made = pod("g", uid="gggggggg-1", cpu="1")
    made["spec"]["containers"][0]["resources"]["requests"]["example.com/fpga"] = "1"
    [said] = mirror.pod_seen(made, 0.0)
    assert said.reason == "Unsupported" and "example.com/fpga" in said.message and said.warning
    assert mirror.pod_seen(made, 1.0) == []


def test_pods_listed_are_submitted_in_the_order_they_were_made_not_by_name():
    mirror = mirror_with_nodes("n1")
    made = []
    for name, at in (("p-10", "2026-11-29T00:00:01Z"), ("p-2", "2026-11-29T00:00:01Z"), ("p-1", "2026-11-29T00:00:00Z")):
        made.append(pod(name, uid=f"{name}-uid"))
        made[-1]["metadata"]["creationTimestamp"] = at
    assert [m["task"].split("/")[1] for m in messages(mirror.pods_listed(made, 2.0), "submitted")] == ["p-1", "p-10", "p-2"]
