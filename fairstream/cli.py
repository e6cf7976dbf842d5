"""The ``fairstream`` command line.

Every input problem ends in one line on stderr (``fairstream: error: ...``) and exit code 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

from fairstream.collector import tuned_gc
from fairstream.core.model import ModelError
from fairstream.sim.traces.files import whole_or_excerpt

ALLOW_PARTIAL = ("table: a gzipped file cut short runs with the rows before the cut (without it, the command "
                 "refuses it, exit 2, so a script notices)")


def _trace_options(args) -> dict:
    """The loader options the command line gave for this trace format (None: the default)."""
    keys = {"swim": ("limit", "nodes", "tenant_count", "max_tasks_per_job"), "google": ("limit", "nodes", "users"),
            "philly": ("limit", "nodes", "tenant_count", "seed", "gangs"),
            "table": ("limit", "nodes", "mapping", "nodes_table", "nodes_mapping", "allow_partial")}[args.format]
    loader_name = {"tenant_count": "tenants"}  # (the loaders' own word for it)
    return {loader_name.get(k, k): getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _tenants_file(value: str) -> str:
    """``--tenants``: a tenants file, everywhere (the worker's, ``configure``'s, ``simulate``'s).
    A number there was a count in simulate and emulate before: say where that went."""
    if value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"takes a tenants file (as the worker's); a number of tenants is "
                                         f"--tenant-count {value.strip()}")
    return value


def _scenario_from_args(args):
    from fairstream.sim.scenario import load_scenario
    from fairstream.sim.traces import load_trace

    if args.trace:
        if args.format is None:
            raise ModelError("--trace needs --format swim|google|philly|table")
        scenario = load_trace(args.trace, args.format, **_trace_options(args))
        if args.scenario:  # the cluster (nodes, tenant tree) comes from a scenario file
            cluster = load_scenario(args.scenario)
            scenario.nodes, scenario.resources = cluster.nodes, cluster.resources
            if cluster.tree.specs:
                scenario.tree = cluster.tree
    elif not args.scenario:
        raise ModelError("give --scenario FILE or --trace FILE --format swim|google|philly|table")
    else:
        scenario = load_scenario(args.scenario)
    if getattr(args, "tenants_file", None):  # the worker's tenants file: its tree replaces the workload's
        from fairstream.sim.scenario import load_tenant_tree

        scenario.tree = load_tenant_tree(args.tenants_file)
    return scenario.with_exact_estimates() if getattr(args, "estimates", "given") == "exact" else scenario


DEFAULT_KNOBS = [0.0, 0.2, 0.5, 0.8, 1.0]
DEFAULT_GOOGLE = whole_or_excerpt("google-clusterdata-2011-2/task_events/part-00000-of-00500.csv.gz",
                                  "google-task_events-part-00001.head3000.csv.gz")


def run_theory(scenario, result) -> dict:
    """QKnobler's theta (Theorem 1) and sharing-incentive knob (Theorem 2) for this scenario, at
    the run's rho for qknobler, else at a few knob values; with the run's measured soft fairness."""
    from fairstream.lab.theory import knob_theory

    rhos = [result.params["rho"]] if result.policy == "qknobler" else DEFAULT_KNOBS
    theory = knob_theory(scenario, rhos)
    theory["measured_soft_fairness"] = result.metrics.soft_fairness_summary()
    return theory


def _floats(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ModelError(f"{option} {text}: expected comma-separated numbers") from None


def cmd_sweep(args) -> int:
    """Policies and knob values over the macro-benchmark or the Google sample: table and plots."""
    from fairstream.lab.sweep import sweep

    knobs = _floats(args.knobs, "--knobs")
    if any(not 0 <= k <= 1 for k in knobs) or 1.0 not in knobs:
        raise ModelError(f"--knobs {args.knobs}: values in [0, 1], including 1 (the speedup baseline)")
    users = [int(u) for u in _floats(args.users, "--users")] if args.workload == "google" else []
    options = {"scale": args.scale, "seed": args.seed} if args.workload == "macro" else {
        "trace": args.trace, "nodes": args.nodes, "limit": args.limit}
    if args.workload == "google" and not Path(args.trace).exists():
        raise ModelError(f"--trace {args.trace}: not found")
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    document = sweep(args.workload, knobs, users, options, Path(args.out), workers=args.workers, progress=args.progress,
                     policies=policies)
    print(json.dumps({"workload": args.workload, "runs": len(document["rows"]), "out": args.out,
                      "figures": document["figures"]}))
    return 0


def cmd_compare_preemption(args) -> int:
    """Policies with and without preemption where tenants arrive to a busy cluster: table and plots."""
    from fairstream.lab.preemption_study import study
    from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    document = study(Path(args.out), workloads, policies, _floats(args.timeouts, "--timeouts"), args.threshold,
                     [int(x) for x in _floats(args.seeds, "--seeds")], str(args.trace or DEFAULT_PHILLY),
                     workers=args.workers, progress=args.progress)
    out = Path(args.out)
    print((out / "table.md").read_text(), end="")
    print(f"\n{len(document['rows'])} settings, {len(document['runs'])} runs; in {out}: table.md, table.csv, "
          f"study.json (every run), " + ", ".join(Path(f).name for f in document["figures"]))
    return 0


def cmd_compare_gangs(args) -> int:
    """The Philly workload with its distributed jobs as gangs and not, per policy: table."""
    from fairstream.lab.gang_study import study
    from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    document = study(Path(args.out), policies, [int(x) for x in _floats(args.seeds, "--seeds")],
                     str(args.trace or DEFAULT_PHILLY), args.limit, workers=args.workers, progress=args.progress,
                     timeout=args.timeout)
    out = Path(args.out)
    print((out / "table.md").read_text(), end="")
    print(f"\n{len(document['rows'])} settings, {len(document['runs'])} runs; in {out}: table.md, study.json")
    return 0


def cmd_compare_forgetting(args) -> int:
    """Rounds, discount and half-life on the LTRF paper's Table 1 at cluster scale: table and plot."""
    from fairstream.lab.forgetting import compare

    document = compare(Path(args.out), args.a_arrives, args.contended_until)
    print(json.dumps({"out": args.out, "table": str(Path(args.out) / "table.md"), "figure": document["figure"],
                      "a_part": {row["label"]: round(row["a_part"], 4) for row in document["rows"]}}))
    return 0


def cmd_train_flex(args) -> int:
    """Simulate labelled workloads, train FLEX's decision trees, write the model and a report."""
    from fairstream.lab.flex_train import train

    report = train(Path(args.out), workloads=args.workloads, seed=args.seed, grid=args.grid, workers=args.workers,
                   progress=args.progress, held_out=args.evaluate,
                   long_term=args.long_term_fairness)
    f1 = {kind: round(r["cross_validation"]["macro avg"]["f1-score"], 3) for kind, r in report["per_sla"].items()}
    against = report.get("against_tetris", {})
    print(json.dumps({"model": str(Path(args.out) / "flex-model.json"), "workloads": report["workloads"],
                      "cross_validated_macro_f1": f1, "out": args.out,
                      **{k: v for k, v in against.items() if k != "per_workload"}}))
    return 0


def cmd_explain(args) -> int:
    """Print QKnobler's theory numbers for a scenario (JSON)."""
    from fairstream.lab.theory import knob_theory

    scenario = _scenario_from_args(args)
    print(json.dumps(knob_theory(scenario, args.rho or DEFAULT_KNOBS), indent=1))
    return 0


def cmd_simulate(args) -> int:
    from fairstream.sim.output import staged

    if args.events:
        return _replay_events(args)
    scenario = _scenario_from_args(args)
    _warn_min_share(scenario.tree)
    with staged(Path(args.out)) as out:  # the old output stays whole unless this run succeeds
        summary = _simulate_into(args, scenario, out)
    print(json.dumps({
        "policy": summary["policy"], "scenario": scenario.name, "tasks": summary["tasks"],
        "decisions": summary["decisions"], "placed_tasks": summary["placed_tasks"],
        "task_placements": summary["task_placements"], "unfinished_tasks": summary["unfinished_tasks"],
        "makespan": summary["makespan"], "sharing_benefit": summary["sharing_benefit"],
        "sharing_loss": summary["sharing_loss"], "out": str(Path(args.out)),
    }))
    return 0


def _simulate_into(args, scenario, out: Path) -> dict:
    """``simulate``'s run of ``scenario`` written into ``out``; returns its summary."""
    from fairstream.policies.base import parse_param_pairs
    from fairstream.sim.output import DecisionWriter, write_run
    from fairstream.sim.simulator import Simulator

    params = parse_param_pairs(args.param)
    progress = None if args.progress is None else args.progress
    writer = DecisionWriter(out)  # decisions go to disk as they are taken, not into memory
    try:
        simulator = Simulator(scenario, args.policy, params, metric_resource=args.metric_resource,
                              progress=progress, on_decision=writer, explain_at=args.explain_at)
        result = simulator.run()
    finally:
        writer.close()
    if simulator.explanation is not None:
        _write_explanation(out, args.cluster, simulator.explanation)
    baseline = None
    if args.policy != "static" and not args.no_baseline:
        baseline = Simulator(scenario, "static", {}, metric_resource=args.metric_resource, progress=progress,
                             on_decision=lambda decision: None).run()
    write_run(result, out, baseline, plots=not args.no_plots, theory=run_theory(scenario, result), decisions_written=True)
    return result.summary()


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    value = _seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text}")
    return value


def _whole(text: str) -> int:
    """An argparse type: a whole number (its range is the setting's to check)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _rates(text: str) -> list[float]:
    """An argparse type: events per second, comma-separated (``1000,2500,5000``)."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of rates: {text!r}") from None
    if not rates or any(not rate > 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"rates must be above 0: {text!r}")
    return rates


def _replay_events(args) -> int:
    """``simulate --events FILE``: replay a worker's recorded input (one JSON step per line:
    ``{"time", "events"}``) through a fresh engine; writes the decisions it takes."""
    from fairstream.policies.base import parse_param_pairs
    from fairstream.sim.scenario import load_tenant_tree
    from fairstream.streams.app import WorkerConfig

    # The engine the worker builds from the same options (equivalence depends on it), or the
    # checkpoint the retained log starts from.
    if args.snapshot:
        from fairstream.state.engine_snapshot import decode_engine

        try:
            engine = decode_engine(Path(args.snapshot).read_bytes())
        except OSError as exc:
            raise ModelError(f"--snapshot {args.snapshot}: cannot read ({exc.strerror})") from None
        except ModelError as exc:
            raise ModelError(f"--snapshot {args.snapshot}: {exc}") from None
    else:
        engine = WorkerConfig(
            policy=args.policy, params=parse_param_pairs(args.param),
            resources=tuple(r.strip() for r in args.resources.split(",") if r.strip()),
            tenants=load_tenant_tree(args.tenants_file) if args.tenants_file else None,
            finished_retention=args.finished_retention,
        ).make_engine()
    try:
        handle = open(args.events)
    except OSError as exc:
        raise ModelError(f"--events {args.events}: cannot read ({exc.strerror})") from None
    from fairstream.sim.output import staged

    with handle, staged(Path(args.out)) as out:  # the old output stays whole unless this run succeeds
        decisions = _replay_events_into(args, engine, handle, out)
    print(json.dumps({"policy": args.policy, "events": args.events, "decisions": decisions, "out": str(Path(args.out))}))
    return 0


def _replay_events_into(args, engine, handle, out: Path) -> int:
    """``simulate --events``: the recorded steps of ``handle`` replayed on ``engine``, the
    decisions and the usage view written into ``out`` (and with ``--explain-at T`` the
    explanation of the engine after the last step at or before T, as a scenario's run writes
    it); returns the count of decisions."""
    from fairstream.wire.log import replay

    decisions = 0
    line = 0
    explanation = None

    def recorded_steps():
        nonlocal line, explanation
        for line, text in enumerate(handle, 1):  # noqa: B007 (the line number is read after the loop, by the error message)
            if text.strip():
                try:
                    step = json.loads(text)
                except ValueError as exc:
                    raise ModelError(f"not a recorded step ({exc})") from None
                # (The steps before it are applied when the next is asked for: replay is lazy.)
                if (args.explain_at is not None and explanation is None and isinstance(step, dict)
                        and isinstance(step.get("time"), (int, float)) and step["time"] > args.explain_at):
                    explanation = _explain_engine(engine)
                yield step

    cluster = {"cluster": args.cluster} if args.cluster else {}
    with open(out / "decisions.jsonl", "w") as written:
        try:
            for result in replay(engine, recorded_steps()):
                for decision in result.decisions:
                    written.write(json.dumps({**cluster, **decision.to_json()}, separators=(",", ":")) + "\n")
                    decisions += 1
        except ModelError as exc:
            raise ModelError(f"{args.events}:{line}: {exc}") from None
    if args.explain_at is not None:
        _write_explanation(out, args.cluster, explanation or _explain_engine(engine))
    from fairstream.streams.views import views

    # The same per-tenant accumulated usage view the worker keeps in Redis, for comparison.
    usage = {name: {k: json.loads(v) for k, v in fields.items()} for name, fields in views(engine).items()
             if name.startswith("usage:")}
    (out / "usage.json").write_text(json.dumps(usage, indent=1))
    return decisions


def _explain_engine(engine):
    """``explain`` of ``engine`` as it stands (a recorded log holds no held-back stages)."""
    from fairstream.core.explain import explain
    from fairstream.core.forecast import MAX_STEPS, MAX_TASKS

    return explain(engine, [], forecast=(MAX_STEPS, MAX_TASKS))


def _write_explanation(out: Path, cluster: str | None, explanation) -> None:
    """``explain/tenants.json`` and ``explain/pending.json`` in ``out``, as the worker's API serves them."""
    from fairstream.wire.visibility import explanation_documents

    folder = out / "explain"
    folder.mkdir(exist_ok=True)
    documents = explanation_documents(cluster or "default", explanation.status_json(), explanation.pending_json())
    for name, document in documents.items():
        (folder / name).write_text(json.dumps(document, indent=1) + "\n")


def cmd_worker(args) -> int:
    from fairstream.streams.run import run_worker

    return run_worker(args)


def cmd_publish(args) -> int:
    from fairstream.producers.client import publish_stdin

    count = publish_stdin(args.broker, args.topic, args.delivery_timeout)
    print(json.dumps({"published": count, "topic": args.topic}), file=sys.stderr)
    return 0


def cmd_configure(args) -> int:
    """Send a cluster's new tenant tree (the ``tenants`` of a file, as the worker's --tenants),
    after the checks the worker will make: the message's form, the tree (a cycle is named), and,
    with the cluster's state read from the worker's Redis, exactly what the worker's engine
    checks (a moved tenant, a tenant with tasks made a queue, an ordering its policy cannot
    honour). ``--dry-run``: the fair shares before and after, nothing sent."""
    import asyncio

    from fairstream.core.engine import EventRejected
    from fairstream.core.model import TenantsChanged
    from fairstream.core.tenants import TenantTree, specs_from_json
    from fairstream.producers.client import Publisher
    from fairstream.wire.topics import Topics

    try:
        document = json.loads(Path(args.tenants).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"--tenants {args.tenants}: cannot read ({exc})") from None
    tenants = document.get("tenants") if isinstance(document, dict) else None
    if not isinstance(tenants, list):
        raise ModelError(f"--tenants {args.tenants}: needs a \"tenants\" list")
    from fairstream.wire.events import CONFIG, BadInput, decode_message

    message = {"cluster": args.cluster, "tenants": tenants, **({"time": args.time} if args.time is not None else {})}
    try:  # the checks the worker makes of its form, here first: one line, nothing sent
        decode_message(CONFIG, json.dumps(message).encode())
        specs = specs_from_json(tenants)
        tree = TenantTree.from_specs(specs)
    except (BadInput, ModelError) as exc:
        raise ModelError(f"--tenants {args.tenants}: {exc}") from None
    _warn_min_share(tree)
    engine, why_not = _worker_engine(args)
    if engine is None:
        print(f"fairstream: warning: {why_not}: checked the file and its tree, not the cluster's state", file=sys.stderr)
        if args.dry_run:
            raise ModelError(f"--dry-run needs the cluster's state: {why_not}")
    else:
        try:  # the worker's own check of it, on the cluster's state: nothing changes
            tree = engine.admission_tree(TenantsChanged(args.time, tuple(specs)))
        except EventRejected as exc:
            raise ModelError(f"--tenants {args.tenants}: the worker would reject it: {exc}") from None
        for warning in _limit_warnings(engine, tree):
            print(f"fairstream: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print(json.dumps(_shares_before_and_after(engine, tree), indent=1))
        return 0

    async def send():
        async with Publisher(args.broker, Topics().with_prefix(args.topic_prefix)) as pub:
            await pub.configure(args.cluster, tenants, args.time)

    asyncio.run(send())
    print(json.dumps({"cluster": args.cluster, "tenants": len(tenants), "sent": True,
                      "checked": "against the cluster's state" if engine is not None else "file and tree only"}))
    return 0


def _warn_min_share(tree) -> None:
    """One line on stderr when the tree's min_shares add up to more than the cluster."""
    from fairstream.core.tenants import min_share_warning

    warning = min_share_warning(tree)
    if warning is not None:
        print(f"fairstream: warning: {warning}", file=sys.stderr)


def _from_store(args, read):
    """``read(store)`` on the worker's Redis state store (``--redis``, ``--app-id``), awaited."""
    import asyncio

    from fairstream.state.store import RedisStore, redis_client

    async def run():
        client = redis_client(args.redis)
        try:
            return await read(RedisStore(client, prefix=args.app_id))
        finally:
            await client.aclose()

    return asyncio.run(run())


def _worker_engine(args):
    """The cluster's engine as the worker holds it (its last snapshot in Redis and the log after
    it, replayed), or None and why not (no Redis, no such cluster, no snapshot yet)."""
    from redis.exceptions import RedisError

    from fairstream.state.engine_snapshot import SnapshotError, decode_engine
    from fairstream.wire.log import replay

    try:
        record = _from_store(args, lambda store: store.load(args.cluster))
    except RedisError as exc:
        return None, f"cannot read the worker's state from Redis ({type(exc).__name__}: {exc})"
    if not record.snapshot:
        return None, (f"no state of cluster {args.cluster!r} under app id {args.app_id!r} in Redis"
                      + (" (no snapshot yet)" if record.log else ""))
    try:
        engine = decode_engine(record.snapshot)
        for _ in replay(engine, record.log):
            pass
    except (SnapshotError, ModelError) as exc:
        return None, f"the cluster's state in Redis cannot be read ({exc})"
    return engine, None


def _shares_before_and_after(engine, tree) -> dict:
    """Per tenant: weight and fair share now and under ``tree`` (same demand); the queues whose
    settings change; what the new limits do to what runs now: for --dry-run."""
    names = [ledger.name for ledger in engine.accounting.ledgers]
    before, after = engine.fair_shares(), engine.fair_shares(tree)
    rows = []
    for row, name in enumerate(names):
        old, new = engine.tree.specs.get(name), tree.specs.get(name)
        rows.append({"tenant": name, "weight_before": old.weight if old else None,
                     "weight_after": new.weight if new else None, "fair_share_before": round(float(before[row]), 6),
                     "fair_share_after": round(float(after[row]), 6)})
    # The queues (inner nodes) whose weight or limits change, added or removed: a leaf's
    # share moves with them (dry runs once listed the leaves only).
    from fairstream.core.tenants import spec_changes

    queues = []
    for name in sorted(set(engine.tree.specs) | set(tree.specs)):
        old, new = engine.tree.specs.get(name), tree.specs.get(name)
        if name in names or (old is not None and old == new):
            continue
        if (old is not None and engine.tree.is_leaf(name)) or (new is not None and tree.is_leaf(name)):
            continue
        queues.append({"queue": name, "before_after": spec_changes(old, new)})
    return {"cluster_time": engine.time, "policy": engine.policy, "tenants": rows, "queues": queues,
            "warnings": _limit_warnings(engine, tree)}


def _limit_warnings(engine, tree) -> list[str]:
    """What ``tree``'s limits do to what runs now: a tenant or queue whose new max_share or
    max_resources is below what it runs (it was accepted without a word: an operator set
    max_share 0 on a tenant with 20 running tasks)."""
    import numpy as np

    from fairstream.core.fairness import dominant_share

    capacity = engine.accounting.capacity
    running: dict[str, int] = {}
    for task in engine.tasks.values():
        if task.state.value == "running":
            running[task.tenant] = running.get(task.tenant, 0) + 1
    allocation = {ledger.name: engine.accounting.allocation[row] for row, ledger in enumerate(engine.accounting.ledgers)}
    warnings = []
    for name, spec in tree.specs.items():
        leaves = [leaf for leaf in allocation if leaf in tree.specs and name in tree.path(leaf)]
        if not leaves:
            continue
        held = np.sum([allocation[leaf] for leaf in leaves], axis=0)
        tasks = sum(running.get(leaf, 0) for leaf in leaves)
        share = dominant_share(held, capacity)
        over = []
        if spec.max_share < 1 and share > spec.max_share + 1e-9:
            over.append(f"max_share {spec.max_share:g} (it holds {share:.4g})")
        for resource, cap in (spec.max_resources or {}).items():
            used = float(held[engine.resources.index(resource)])
            if used > cap + 1e-9:
                over.append(f"max_resources {resource} {cap:g} (it uses {used:g})")
        if over and tasks:
            preemption = ("with preemption on they are taken back, as its fair share shrinks to the limit, when a "
                          "tenant below its fair share waits" if engine.preemption is not None else
                          "preemption is off: they run to their end")
            warnings.append(f"{name} runs {tasks} task{'s' if tasks != 1 else ''} over its new {' and '.join(over)}: "
                            f"they keep running and none of its tasks starts until it is within it; {preemption}")
    return warnings


def cmd_tail(args) -> int:
    from fairstream.producers.client import tail

    tail(args.broker, args.topic, not args.latest, args.idle_timeout, args.count)
    return 0


def _visibility(args):
    from fairstream.state.store import ViewReader, redis_client
    from fairstream.streams.api import Visibility

    return Visibility(ViewReader(redis_client(args.redis, sync=True), args.app_id))


def _table(rows: list[list], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def cmd_status(args) -> int:
    """Each tenant of a running worker's cluster: share, fair share, the policy's key and rank."""
    from fairstream.streams.api import NotFound

    try:
        document = _visibility(args).tenants(args.cluster)
    except NotFound as exc:
        raise ModelError(str(exc)) from None
    if args.json:
        print(json.dumps(document, indent=1))
        return 0
    print(status_table(document))
    return 0


def status_table(document: dict) -> str:
    """``fairstream status``'s table of a ``/v1`` tenants document: a row per tenant, its limits
    as configured and since when it is starved (with preemption on)."""

    def limits(t: dict) -> str:
        return ", ".join(f"{name} {_text_limit(value)}" for name, value in t.get("limits", {}).items()) or "-"

    rows = [[t["tenant"], t["rank"] or "-", _num(t["weight"], 3), _num(t["fair_share"]),
             _num(max(t["share"].values(), default=0.0)), _num(t["order_value"]), t["running"], t["pending"],
             _num(t["quantum"]), limits(t), "-" if t["starved_since"] is None else f"{t['starved_since']:g}"]
            for t in document["tenants"]]
    return (f"cluster {document['cluster']} at event time {document['time']:g}, policy {document['policy']}, "
            f"order: {document['order']} (smaller first)\n"
            + _table(rows, ["tenant", "rank", "weight", "fair share", "share", "key", "running", "pending", "quantum",
                            "limits", "starved since"]))


def _text_limit(value) -> str:
    """A limit as the tenants file writes it: a number, or resources (``max_resources``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{r}: {_num(v)}" for r, v in value.items()) + "}"
    return _num(value) if isinstance(value, float) else str(value)


def cmd_pending(args) -> int:
    """Why pending tasks wait in a running worker's cluster: one tenant's, one task, or all."""
    from fairstream.streams.api import NotFound
    from fairstream.wire.visibility import DocumentError

    try:
        document = _visibility(args).pending(args.cluster, args.tenant, args.task, args.page, args.size, args.reason,
                                             group=not args.no_group)
    except NotFound as exc:
        raise ModelError(str(exc)) from None
    except DocumentError as exc:
        raise ModelError(str(exc)) from None
    if args.json:
        print(json.dumps(document, indent=1))
        return 0
    if args.task:
        entry = document["entry"]
        print(f"{args.task} ({entry['tenant']}, job {entry['job']}): position {document['position']} in "
              f"{entry['tenant']}'s queue, its tenant {_rank(entry['tenant_rank'])}; its entry starts at "
              f"{_expected(entry)} (expected); {entry['reason']}: {entry['message']}")
        return 0
    shown = len(document["entries"])
    first = (document["page"] - 1) * document["size"]
    what = "rows (alike entries grouped)" if document["grouped"] else "entries"
    print(f"cluster {document['cluster']} at event time {document['time']:g}, policy {document['policy']}: "
          f"{document['tasks_total']} pending tasks in {document['entries_total']} entries"
          + (f" waiting for {document['reason']}" if document["reason"] else "")
          + f"; {what} {first + 1 if shown else 0}-{first + shown} of {document['entries_listed']} listed")

    def named(e: dict) -> str:
        return e["id"] if e.get("entries", 1) == 1 else f"{e['id']} ... {e['last']} ({e['entries']} entries)"

    rows = [[e["tenant"], e["tenant_rank"] or "-", e["position"], named(e), e["tasks"], _expected(e), e["reason"],
             e["message"]] for e in document["entries"]]
    print(_table(rows, ["tenant", "rank", "position", "task or request", "tasks", "starts (expected)", "reason", "why"]))
    return 0


def _expected(entry: dict) -> str:
    start = entry.get("expected_start")
    return "unknown" if start is None else f"{start:g}"


def _rank(rank: int | None) -> str:
    return "unranked" if rank is None else \
        f"ranks {rank} among the waiting tenants"


def cmd_export_log(args) -> int:
    """Write a cluster's recorded input from Redis, one step per line (for ``simulate --events``),
    and, when ``--log-retention`` trimmed the log's head, the engine it starts from."""
    retained = _from_store(args, lambda store: store.full_log(args.cluster))
    if retained.base_steps and not args.snapshot_out:
        raise ModelError(f"the log of cluster {args.cluster} starts at step {retained.base_steps} (older steps were "
                         "trimmed by --log-retention): pass --snapshot-out FILE for the engine it starts from")
    if retained.base_steps and retained.base_snapshot is None:
        raise ModelError(f"the log of cluster {args.cluster} starts at step {retained.base_steps}, "
                         "but the checkpoint there is missing from the store")
    text = "".join(json.dumps(step, separators=(",", ":")) + "\n" for step in retained.steps)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    if retained.base_steps:
        Path(args.snapshot_out).write_bytes(retained.base_snapshot)
    print(json.dumps({"cluster": args.cluster, "steps": len(retained.steps), "base_steps": retained.base_steps}),
          file=sys.stderr)
    return 0


def _workload(args):
    from fairstream.sim.scenario import load_scenario
    from fairstream.sim.traces import load_trace

    if args.format == "scenario":
        return load_scenario(args.trace)
    return load_trace(args.trace, args.format, **_trace_options(args))


def cmd_replay(args) -> int:
    import asyncio

    from fairstream.producers.emulator import replay_only
    from fairstream.wire.topics import Topics

    scenario = _workload(args)
    count = asyncio.run(replay_only(scenario, args.cluster, args.broker, Topics().with_prefix(args.topic_prefix), args.speed,
                                    args.delivery_timeout))
    print(json.dumps({"cluster": args.cluster, "nodes": len(scenario.nodes), "submitted": count}))
    return 0


def cmd_emulate(args) -> int:
    from fairstream.producers.emulator import run
    from fairstream.wire.topics import Topics

    scenario = _workload(args)
    report = run(scenario, args.cluster, args.broker, Topics().with_prefix(args.topic_prefix), args.speed,
                 args.heartbeat_interval, not args.no_replay, args.timeout, args.delivery_timeout)
    print(json.dumps({"cluster": args.cluster, "tasks": scenario.task_count, **report.to_json()}))
    return 0 if not report.over_committed and report.completed == scenario.task_count else 1


def cmd_kubernetes(args) -> int:
    try:
        from fairstream.kube.connector import ConnectorConfig, run
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("lightkube", "httpx2"):
            raise
        raise ModelError("kubernetes needs lightkube, which comes with fairstream's kubernetes extra: "
                         "pip install 'fairstream[kubernetes]'") from None
    from fairstream.wire.topics import Topics

    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        raise ModelError(f"--kubeconfig {args.kubeconfig}: no such file")
    resources = tuple(r.strip() for r in args.resources.split(",") if r.strip())
    selector = {}
    for pair in filter(None, (p.strip() for p in args.node_selector.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ModelError(f"--node-selector {args.node_selector}: give key=value pairs, comma-separated")
        selector[key] = value
    if not resources:
        raise ModelError("--resources: give at least one resource (cpu,mem)")
    import yaml
    from lightkube import ApiError, ConfigError

    config = ConnectorConfig(
        cluster=args.cluster, broker=args.broker, topics=Topics().with_prefix(args.topic_prefix),
        kubeconfig=args.kubeconfig, context=args.context, resources=resources, node_selector=selector,
        scheduler_name=args.scheduler_name, queue_label=args.queue_label,
        heartbeat_interval=args.heartbeat_interval, lost_after=args.node_lost_after,
        worker_url=args.worker_url or None, explain_interval=args.explain_interval, explain_rate=args.explain_rate,
        group=args.group, finalizer=args.finalizer)
    try:
        run(config)
    except ApiError as exc:
        hint = (" (check the kubeconfig's credentials, and that the ClusterRole of deploy/kubernetes/rbac.yaml is "
                "bound to them)" if exc.status.code in (401, 403) else "")
        raise ModelError(f"the Kubernetes API server refused: {exc.status.message or exc}{hint}") from None
    except (ConfigError, yaml.YAMLError, KeyError) as exc:
        where = args.kubeconfig or "the kubeconfig ($KUBECONFIG, ~/.kube/config or the pod's ServiceAccount)"
        raise ModelError(f"{where}: not a usable kubeconfig ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    return 0


DRILLS = ("poison", "oversize", "far-future", "kill-9", "redis-empty", "redis-older", "kill-9-redis-empty", "kill-9-redis-older", "planted-snapshot", "kafka-restart")


def cmd_drill(args) -> int:
    from fairstream.lab.drill import FAULTS, print_table, run_drill

    unknown = [name for name in args.names if name not in FAULTS]
    if unknown:
        raise ModelError(f"unknown drill {unknown[0]!r} (known: {', '.join(FAULTS)})")
    reports = []
    for name in args.names or list(FAULTS):
        report = run_drill(name, args.broker, args.redis, tasks=args.tasks, speed=args.speed)
        reports.append(report)
        if args.json:
            print(json.dumps(report.to_json()), flush=True)
    if not args.json:
        print(print_table(reports))
    return 0 if all(r.passed for r in reports) else 1


def cmd_demo(args) -> int:
    from fairstream.sim.demo import run_demo

    return run_demo(Path(args.out), seed=args.seed, scale=args.scale, progress=args.progress)


def cmd_policies(args) -> int:
    from fairstream.policies import REGISTRY

    for spec in REGISTRY.values():
        print(f"{spec.name}: {spec.summary}")
        for p in spec.params:
            default = "inf" if isinstance(p.default, float) and math.isinf(p.default) else p.default
            print(f"    {p.name}={default}  {p.doc}")
    return 0


def cmd_generate(args) -> int:
    from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY, late_tenants, read_runtimes
    from fairstream.sim.traces.macro import macro_benchmark

    if args.workload == "macro":
        weights = tuple(float(w) for w in args.weights.split(":"))
        scenario = macro_benchmark(seed=args.seed, weights=weights, scale=args.scale, memory_only=args.memory_only)
    else:
        runtimes = read_runtimes(args.trace or DEFAULT_PHILLY) if args.workload == "philly" else None
        scenario = late_tenants(runtimes, name=args.workload, seed=args.seed, gangs=args.gangs)
    text = json.dumps(scenario.to_json(), indent=None, separators=(",", ":"))
    if args.out == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(args.out).write_text(text + "\n")
    return 0


def cmd_bench(args) -> int:
    if args.target == "kubernetes":
        from fairstream.lab.bench_kubernetes import bench_kubernetes

        print(json.dumps(bench_kubernetes(nodes=args.kube_nodes, pods=args.kube_pods, rate=args.kube_rate,
                                          rate_seconds=args.kube_rate_seconds, fair_pods=args.kube_fair_pods,
                                          schedulers=tuple(args.schedulers.split(",")),
                                          kube_scheduler_qps=args.kube_scheduler_qps,
                                          phases=tuple(p for p in args.kube_phases.split(",") if p),
                                          finalizer=not args.kube_no_finalizer)))
        return 0
    if args.target == "stream":
        from fairstream.lab.bench_stream import bench_stream, saturation_curve

        rates = [args.rate] if args.rates is None else args.rates
        runs = [bench_stream(rate=rate, duration=args.duration, nodes=args.stream_nodes,
                             tenants=args.stream_tenants, retention=args.retention,
                             batch_window=args.batch_window, per_message=args.events_per_message,
                             send_interval=args.send_interval, worker_args=args.worker_args) for rate in rates]
        print(json.dumps(runs[0] if args.rates is None else saturation_curve(runs)))
        return 0
    if args.target == "e2e":
        from fairstream.lab.bench import bench_e2e

        policies = args.policies.split(",")
        print(json.dumps(bench_e2e(policies, durations=args.durations, time_check=not args.no_time_check)))
        return 0
    if args.target == "spread":
        from fairstream.lab.bench import SPREAD_WORKLOADS, bench_spread
        from fairstream.policies import REGISTRY

        policies = sorted(REGISTRY) if args.policies == "all" else args.policies.split(",")
        workloads = list(SPREAD_WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
        unknown = [w for w in workloads if w not in SPREAD_WORKLOADS]
        if unknown:
            raise ModelError(f"--workloads {','.join(unknown)}: one of {', '.join(SPREAD_WORKLOADS)}, or all")
        print(json.dumps(bench_spread(policies, workloads, repeat=args.repeat)))
        return 0
    if args.target == "day":
        from fairstream.lab.bench import bench_day

        print(json.dumps(bench_day(args.policies.split(","), scale=args.scale, nodes=args.day_nodes,
                                   progress=args.progress, hours=args.hours)))
        return 0
    from fairstream.lab.bench import bench_engine

    result = bench_engine(
        tenants=args.tenants, nodes=args.nodes, pending=args.pending, policies=[p for p in args.policies.split(",") if p],
        trace=args.trace, progress=args.progress,
        knob_policies=[p for p in args.knob_policies.split(",") if p],
    )
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fairstream.streams.config import WorkerConfig as worker_defaults  # light: no Faust, no engine

    parser = argparse.ArgumentParser(prog="fairstream", description="Streaming fair-share scheduler and simulator.")
    sub = parser.add_subparsers(dest="command", required=True)

    progress = argparse.ArgumentParser(add_help=False)
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="always show a progress bar (default: only on a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")

    workload = argparse.ArgumentParser(add_help=False)  # where a run's tasks and cluster come from
    workload.add_argument("--scenario", help="scenario JSON (see fairstream/schemas/scenario.schema.json)")
    workload.add_argument("--trace", help="a real trace file")
    workload.add_argument("--format", choices=["swim", "google", "philly", "table"],
                          help="trace format (philly: tenants arriving to a busy cluster, run times drawn from the "
                               "file; table: any CSV/TSV through --mapping; docs/workloads.md)")
    workload.add_argument("--mapping", help="table: the column mapping (YAML or JSON), or a shipped one by name: "
                                            "alibaba-2017, google-2011, philly")
    workload.add_argument("--nodes-table", dest="nodes_table", help="table: the nodes as a table (with --nodes-mapping)")
    workload.add_argument("--nodes-mapping", dest="nodes_mapping",
                          help="table: the node table's mapping, or a shipped one: alibaba-2018-nodes")
    workload.add_argument("--allow-partial", action="store_true", dest="allow_partial", help=ALLOW_PARTIAL)
    workload.add_argument("--limit", type=int,
                          help="trace: first N jobs (swim), tasks (google), or jobs per late tenant (philly)")
    workload.add_argument("--tenant-count", type=int, dest="tenant_count",
                          help="swim: number of queues, jobs round robin (default 4); philly: tenants (default 4)")
    workload.add_argument("--seed", type=int, help="philly: generator seed (default 1)")
    workload.add_argument("--gangs", action="store_true", default=None,
                          help="philly: a job of several GPUs is a gang (its tasks start together or not at all)")
    workload.add_argument("--users", type=int, help="google: keep the first N users")
    workload.add_argument("--max-tasks-per-job", type=int, dest="max_tasks_per_job",
                          help="swim: at most N maps and N reduces per job (the papers capped their largest jobs so)")
    workload.add_argument("--estimates", choices=["given", "exact"], default="given",
                          help="tasks' run-time estimates, which backfill reads (reservation=backfill): those the "
                               "scenario gives (default), or exact: each task without one gets its true duration")
    workload.add_argument("--nodes", type=int, help="trace: number of nodes of the default cluster")

    sim = sub.add_parser("simulate", parents=[progress, workload], help="run one policy over a scenario or a trace")
    sim.add_argument("--events", help="replay a worker's recorded input (from `fairstream export-log`)")
    sim.add_argument("--resources", default="cpu,mem", help="with --events: resource names (default cpu,mem)")
    sim.add_argument("--tenants", "--tenants-file", dest="tenants_file", type=_tenants_file,
                     help="the tenant tree, a JSON file with a \"tenants\" list (the worker's --tenants): replaces the "
                          "scenario's or trace's tree; with --events, the worker's")
    sim.add_argument("--cluster", help="with --events: cluster id to stamp on the decisions")
    sim.add_argument("--snapshot", help="with --events: the engine the log starts from (export-log --snapshot-out; "
                                        "plain data in a versioned format, never a pickle)")
    sim.add_argument("--finished-retention", type=float, default=worker_defaults.finished_retention, help="with --events: the worker's --finished-retention")
    sim.add_argument("--policy", required=True)
    sim.add_argument("--param", action="append", metavar="NAME=VALUE", help="policy parameter (repeatable)")
    sim.add_argument("--metric-resource", help="resource the fairness metrics are in (default mem, else dominant)")
    sim.add_argument("--out", required=True, help="output directory")
    sim.add_argument("--no-baseline", action="store_true", help="skip the second, static run used for speedup_vs_static (it about doubles the run's time)")
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--explain-at", type=float, metavar="T",
                     help="write explain/tenants.json and explain/pending.json for event time T: each tenant's "
                          "status and why each pending task waits, as the worker's HTTP API serves them")
    sim.set_defaults(func=cmd_simulate)

    demo = sub.add_parser("demo", parents=[progress], help="the four-queue macro-benchmark: static vs fair vs ltrf")
    demo.add_argument("--out", default="demo-out")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--scale", type=float, default=1.0, help="shrink task counts (1.0 = the full benchmark)")
    demo.set_defaults(func=cmd_demo)

    explain = sub.add_parser("explain", parents=[workload],
                             help="QKnobler's theory for a scenario: phi, DRF shares, theta per knob, sharing-incentive knob")
    explain.add_argument("--rho", type=float, action="append", help="knob value for theta (repeatable; default 0, 0.2, 0.5, 0.8, 1)")
    explain.set_defaults(func=cmd_explain)

    sweep = sub.add_parser("sweep", parents=[progress], help="policies x knob values over a workload: table and plots "
                                                             "(QKnobler paper Figures 6-9)")
    sweep.add_argument("workload", choices=["macro", "google"])
    sweep.add_argument("--out", default="sweep-out")
    sweep.add_argument("--knobs", default="0,0.2,0.4,0.6,0.8,1", help="rho (QKnobler) and f (Tetris) values; must include 1")
    sweep.add_argument("--policies", default="drf,tetris,qknobler",
                       help="policies compared with static partitioning (Figures 7 and 9; any of `fairstream policies`)")
    sweep.add_argument("--scale", type=float, default=1.0, help="macro: shrink task counts")
    sweep.add_argument("--seed", type=int, default=1, help="macro: generator seed")
    sweep.add_argument("--trace", default=str(DEFAULT_GOOGLE), help="google: a task_events part (default: part 00000 "
                                                                    "in ../shared/traces if there, else the excerpt "
                                                                    "of part 00001 in tests/data)")
    sweep.add_argument("--nodes", type=int, default=500, help="google: machines of <0.5, 0.5, 0.5> (500: the sample "
                                                               "contends; see docs/workloads.md)")
    sweep.add_argument("--users", default="20,60,100,137", help="google: user counts for Figure 9 (Figure 8 uses 100, "
                                                                 "or the largest)")
    sweep.add_argument("--limit", type=int, help="google: first N tasks only")
    sweep.add_argument("--workers", type=int, help="parallel simulations (default: one per core)")
    sweep.set_defaults(func=cmd_sweep)

    compare = sub.add_parser("compare-preemption", parents=[progress],
                             help="policies with and without preemption where tenants arrive to a busy cluster: "
                                  "time to fair share, work lost, makespan, job completion time; table and plots")
    compare.add_argument("--out", default="preemption-out")
    compare.add_argument("--workloads", default="philly,long-tasks", help="philly and/or long-tasks")
    compare.add_argument("--policies", default="drf,ltrf", help="policies with a preemption parameter")
    compare.add_argument("--timeouts", default="60,600", help="preemption_timeout values (seconds) to run with")
    compare.add_argument("--threshold", type=float, default=0.5, help="preemption_threshold")
    compare.add_argument("--seeds", default="1,2,3", help="workload seeds; the table gives the mean and range")
    compare.add_argument("--trace", help="philly: the run-time file (default: the whole Philly file in ../shared/traces "
                                         "if there, else its first 100 values in tests/data)")
    compare.add_argument("--workers", type=int, help="parallel simulations (default: one per core)")
    compare.set_defaults(func=cmd_compare_preemption)

    gangs = sub.add_parser("compare-gangs", parents=[progress],
                           help="the Philly workload with its multi-GPU jobs as gangs and not, per policy: GPU "
                                "utilisation, job completion time, time to fair share, GPU-hours held idle by jobs "
                                "partly started; table")
    gangs.add_argument("--out", default="gangs-out")
    gangs.add_argument("--policies", default="ltrf,hltrf,drf,fair")
    gangs.add_argument("--seeds", default="1,2,3", help="workload seeds; the table gives the mean and range")
    gangs.add_argument("--limit", type=int, help="jobs per late tenant (default 100; the backlog is ten times that)")
    gangs.add_argument("--trace", help="the Philly run-time file (default: the whole file in ../shared/traces if "
                                       "there, else its first 100 values in tests/data)")
    gangs.add_argument("--timeout", type=float, help="preemption on at this preemption_timeout (seconds; default off)")
    gangs.add_argument("--workers", type=int, help="parallel simulations (default: one per core)")
    gangs.set_defaults(func=cmd_compare_gangs)

    forgetting = sub.add_parser("compare-forgetting",
                                help="ltrf's ways of forgetting usage (rounds, discount, half-life) against fair and "
                                     "F-LTMM on the LTRF paper's Table 1 at cluster scale: table and plot")
    forgetting.add_argument("--out", default="forgetting-out")
    forgetting.add_argument("--a-arrives", type=float, default=300.0, help="when A arrives (B is alone before)")
    forgetting.add_argument("--contended-until", type=float, default=900.0, help="when both stop submitting")
    forgetting.set_defaults(func=cmd_compare_forgetting)

    train = sub.add_parser("train-flex", parents=[progress],
                           help="train FLEX's decision trees from simulated workloads (model, report, confusion matrices)")
    train.add_argument("--out", default="flex-model")
    train.add_argument("--workloads", type=int, default=48, help="simulated workloads (half Facebook-like, half Google-like)")
    train.add_argument("--seed", type=int, default=1)
    train.add_argument("--grid", action="store_true", help="grid-search the tree's parameters (default: the paper's Table 4)")
    train.add_argument("--workers", type=int, help="parallel simulations (default: one per core)")
    train.add_argument("--long-term-fairness", action="store_true",
                       help="label with the long-term fairness loss (section 5.2.4) instead of formula 8's")
    train.add_argument("--evaluate", type=int, default=0, metavar="N",
                       help="also run the model on N held-out workloads against Tetris (the paper's section 5.2)")
    train.set_defaults(func=cmd_train_flex)

    pol = sub.add_parser("policies", help="list policies and their parameters")
    pol.set_defaults(func=cmd_policies)

    gen = sub.add_parser("generate", help="write a generated workload as a scenario file (macro: the four-queue "
                                          "macro-benchmark; philly, long-tasks: tenants arriving to a busy cluster)")
    gen.add_argument("workload", choices=["macro", "philly", "long-tasks"])
    gen.add_argument("--trace", help="philly: the run-time file (default: the whole Philly file in ../shared/traces if "
                                     "there, else its first 100 values in tests/data)")
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--weights", default="1:1:1:1", help="queue weights Facebook:Purdue:Spark:TPC-H")
    gen.add_argument("--scale", type=float, default=1.0)
    gen.add_argument("--memory-only", action="store_true", help="one resource, memory (as YARN 2.2)")
    gen.add_argument("--gangs", action="store_true",
                     help="philly, long-tasks: a job of several GPUs is a gang (its tasks start together or not at all)")
    gen.add_argument("--out", default="-")
    gen.set_defaults(func=cmd_generate)

    env_broker = os.environ.get("FAIRSTREAM_BROKER", worker_defaults.broker)
    env_redis = os.environ.get("FAIRSTREAM_REDIS_URL", worker_defaults.redis_url)

    # (Each option is parsed here and its range checked by WorkerConfig, once: streams/config.py.)
    worker = sub.add_parser("worker", help="the streaming worker: Kafka in, decisions out, state in Redis")
    worker.add_argument("--policy", required=True)
    worker.add_argument("--param", action="append", metavar="NAME=VALUE")
    worker.add_argument("--tenants", type=_tenants_file, help="JSON file with a \"tenants\" tree (scenario format)")
    worker.add_argument("--no-auto-tenants", action="store_true", help="reject tasks of tenants not in --tenants")
    worker.add_argument("--resources", default="cpu,mem")
    worker.add_argument("--broker", default=None, help=f"Kafka bootstrap server (env FAIRSTREAM_BROKER, default {env_broker})")
    worker.add_argument("--redis", default=None, help="Redis URL (env FAIRSTREAM_REDIS_URL); rediss:// for TLS")
    worker.add_argument("--app-id", default=worker_defaults.app_id, help="Kafka consumer group and Redis key prefix")
    worker.add_argument("--node-timeout", type=_seconds, default=None, help="seconds of event time without heartbeat before a node is lost")
    worker.add_argument("--max-lateness", type=_seconds, default=worker_defaults.max_lateness, help="seconds an event may lag the cluster clock")
    worker.add_argument("--max-ahead", type=_seconds, default=worker_defaults.max_ahead,
                        help="seconds an event may be ahead of its cluster's clock, beyond how far its producer's clock "
                             "moved since the cluster's latest event (default a day); one further ahead is a dead letter")
    worker.add_argument("--topic-prefix", default="", help="prefix every topic name with PREFIX.")
    worker.add_argument("--partitions", type=_whole, default=worker_defaults.partitions,
                        help="partitions of each topic the worker creates at start (existing topics are left as they are)")
    worker.add_argument("--step-window", type=_seconds, default=worker_defaults.step_window,
                        help="events within this many seconds of event time make one scheduling step (0: exact times)")
    worker.add_argument("--step-wait", type=_seconds, default=worker_defaults.step_wait,
                        help="seconds a step stays open for events of its window that come in the next batch, after "
                             "its last ones came (at most --step-window + this after its first); 0: a batch's end "
                             "ends its steps")
    worker.add_argument("--fetch-max-wait", type=_seconds, default=worker_defaults.fetch_max_wait,
                        help="seconds the broker may hold a fetch for more data (Faust's own 1.5 s delays "
                             "busy partitions under load; docs/architecture.md)")
    worker.add_argument("--fetch-min-bytes", type=_whole, default=worker_defaults.fetch_min_bytes,
                        help="bytes of records the broker gathers before it answers a fetch (within --fetch-max-wait); "
                             "1 answers at the first record, at the cost of many small fetches under load")
    worker.add_argument("--session-timeout", type=_seconds, default=worker_defaults.session_timeout,
                        help="seconds without the worker's heartbeats before Kafka gives its partitions to the group's "
                             "other workers: how long a worker killed without leaving holds them (Kafka's "
                             "session.timeout.ms; the broker allows 6 to 1,800 by default)")
    worker.add_argument("--batch-window", type=_seconds, default=worker_defaults.batch_window,
                        help="longest a batch waits for input Kafka already holds for the agent (a batch goes as soon as "
                             "the previous one is applied, with what arrived meanwhile, up to 500 messages)")
    worker.add_argument("--finished-retention", type=_seconds, default=worker_defaults.finished_retention,
                        help="seconds of event time a finished task's id is remembered (duplicate detection)")
    worker.add_argument("--metrics-port", type=_whole, default=worker_defaults.metrics_port,
                        help="HTTP on ADDRESS:PORT: Prometheus /metrics, the /v1 visibility API and the web page at / "
                             "(0: off)")
    worker.add_argument("--metrics-address", default=worker_defaults.metrics_address, help="address of the metrics endpoint (0.0.0.0 in containers)")
    worker.add_argument("--explain-interval", type=_seconds, default=worker_defaults.explain_interval,
                        help="seconds of wall time between writes of each cluster's explanation (why tasks wait, "
                             "tenants' status) to Redis; inf: never")
    worker.add_argument("--explain-max-entries", type=_whole, default=worker_defaults.explain_max_entries,
                        help="pending entries kept per tenant in the explanation (a request counts once)")
    worker.add_argument("--log-retention", type=_seconds, default=None,
                        help="seconds of event time of input log kept in Redis (default: all); older steps are "
                             "trimmed to a checkpoint that export-log --snapshot-out writes")
    worker.add_argument("--max-engines", type=_whole, default=worker_defaults.max_engines,
                        help="cluster engines kept in memory; the least recently used is dropped beyond it and "
                             "recovered from Redis when its cluster is heard from again")
    worker.add_argument("--snapshot-inline", action="store_true",
                        help="encode engine snapshots in the worker process, pausing it, rather than in a forked child "
                             "(for platforms where fork is unwelcome)")
    worker.add_argument("--stop-timeout", type=_seconds, default=worker_defaults.stop_timeout,
                        help="seconds a stop (SIGTERM, SIGINT) may take to leave the group and commit offsets; then "
                             "the worker exits at once, which loses nothing (its state is committed in Redis)")
    worker.add_argument("--data-dir", default=None,
                        help="Faust's local directory (default: <tmp>/fairstream-faust/<app-id>; no state of ours is kept there)")
    worker.set_defaults(func=cmd_worker)

    kube = sub.add_parser("kubernetes", help="schedule a Kubernetes cluster: its nodes and pods to the worker's "
                                             "topics, its decisions to Bindings and Evictions (docs/kubernetes.md)")
    kube.add_argument("--cluster", default="default", help="the cluster's id on the topics (the worker's cluster)")
    kube.add_argument("--kubeconfig", default=None, help="a kubeconfig file (default: the pod's ServiceAccount in a "
                                                         "cluster, else $KUBECONFIG or ~/.kube/config)")
    kube.add_argument("--context", default=None, help="the kubeconfig's context (default: its current one)")
    kube.add_argument("--scheduler-name", default="fairstream", help="pods whose spec.schedulerName is this are ours")
    kube.add_argument("--node-selector", default="", help="only nodes with these labels (key=value,...; default: "
                                                           "every node)")
    kube.add_argument("--queue-label", default="kueue.x-k8s.io/queue-name",
                      help="the pod label that names its tenant (default Kueue's; without it: the namespace)")
    kube.add_argument("--resources", default="cpu,mem", help="the worker's --resources: cpu (cores), mem (memory, "
                                                             "MiB) and extended resources by name (nvidia.com/gpu)")
    kube.add_argument("--broker", default=env_broker)
    kube.add_argument("--topic-prefix", default="")
    kube.add_argument("--heartbeat-interval", type=positive_seconds, default=10.0,
                      help="seconds between heartbeats of every node (they move the worker's clock)")
    kube.add_argument("--node-lost-after", type=positive_seconds, default=300.0,
                      help="seconds a node may be NotReady before it is lost and its pods deleted (Kubernetes' "
                           "default toleration of not-ready is 300 s); a deleted node is lost at once")
    kube.add_argument("--worker-url", default="http://127.0.0.1:9464",
                      help="the worker's HTTP endpoint, to read why pods wait ('' : do not)")
    kube.add_argument("--explain-interval", type=positive_seconds, default=5.0,
                      help="seconds between reads of why pods wait")
    kube.add_argument("--explain-rate", type=positive_seconds, default=20.0,
                      help="most condition and Event writes a second")
    kube.add_argument("--no-finalizer", dest="finalizer", action="store_false",
                      help="put no finalizer on pods (one API write less a pod; a pod deleted while the connector is "
                           "down is then never withdrawn from the worker)")
    kube.add_argument("--group", default=None, help="the decisions' consumer group (default "
                                                    "fairstream-kubernetes.<cluster>)")
    kube.set_defaults(func=cmd_kubernetes)

    publish = sub.add_parser("publish", help="send JSON events from stdin (one per line) to a topic")
    publish.add_argument("--topic", required=True)
    publish.add_argument("--broker", default=env_broker)
    _delivery_timeout_option(publish)
    publish.set_defaults(func=cmd_publish)

    configure = sub.add_parser("configure", help="change a running cluster's tenant tree (weights, shares, new "
                                                 "queues) through the tenants.config topic; usage is kept")
    configure.add_argument("--cluster", default="default")
    configure.add_argument("--tenants", required=True, type=_tenants_file, help="JSON file with the whole \"tenants\" tree (scenario "
                                                            "format, as the worker's --tenants)")
    configure.add_argument("--time", type=float, help="event time it applies at (default: the cluster's clock when "
                                                      "the worker reads it)")
    configure.add_argument("--broker", default=env_broker)
    configure.add_argument("--topic-prefix", default="")
    configure.add_argument("--redis", default=env_redis, help="the worker's Redis, to check the tree against the "
                                                              "cluster's state as the worker will")
    configure.add_argument("--app-id", default=worker_defaults.app_id, help="the worker's app id (its Redis prefix)")
    configure.add_argument("--dry-run", action="store_true", help="print each tenant's fair share before and after; "
                                                                  "send nothing")
    configure.set_defaults(func=cmd_configure)

    tail_cmd = sub.add_parser("tail", help="print decisions (or any topic) as JSON lines")
    tail_cmd.add_argument("--topic", default="allocations.decisions")
    tail_cmd.add_argument("--broker", default=env_broker)
    tail_cmd.add_argument("--latest", action="store_true", help="only messages from now on")
    tail_cmd.add_argument("--idle-timeout", type=float, default=None, help="stop after this many idle seconds")
    tail_cmd.add_argument("--count", type=int, default=None, help="stop after N messages")
    tail_cmd.set_defaults(func=cmd_tail)

    for name, helptext in (("replay", "publish a workload's heartbeats and submissions at trace times"),
                           ("emulate", "play the cluster: run decided tasks for their trace durations, publish completions")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("trace", help="trace or scenario file")
        cmd.add_argument("--format", choices=["swim", "google", "philly", "table", "scenario"], required=True)
        cmd.add_argument("--mapping", help="table: the column mapping, or a shipped one by name")
        cmd.add_argument("--nodes-table", dest="nodes_table")
        cmd.add_argument("--nodes-mapping", dest="nodes_mapping")
        cmd.add_argument("--allow-partial", action="store_true", dest="allow_partial", help=ALLOW_PARTIAL)
        cmd.add_argument("--cluster", default="default")
        cmd.add_argument("--speed", type=float, default=100.0, help="event seconds per wall second")
        cmd.add_argument("--limit", type=int)
        cmd.add_argument("--tenant-count", type=int, dest="tenant_count", help="swim: queues; philly: tenants")
        cmd.add_argument("--nodes", type=int)
        cmd.add_argument("--broker", default=env_broker)
        cmd.add_argument("--topic-prefix", default="")
        _delivery_timeout_option(cmd)
        if name == "emulate":
            cmd.add_argument("--heartbeat-interval", type=float, default=30.0, help="seconds of event time")
            cmd.add_argument("--no-replay", action="store_true", help="do not publish submissions (run `replay` too)")
            cmd.add_argument("--timeout", type=float, default=None, help="give up after this many wall seconds")
        cmd.set_defaults(func=cmd_replay if name == "replay" else cmd_emulate)

    drill = sub.add_parser("drill", help="chaos drills on a real Kafka and Redis: hostile input, kill -9, Redis lost; "
                                         "prints a table (docs/benchmarks.md, Drills)")
    drill.add_argument("names", nargs="*", metavar="DRILL", help="which (default: all): " + ", ".join(DRILLS))
    drill.add_argument("--tasks", type=int, default=300, help="tasks the emulated cluster runs in each drill")
    drill.add_argument("--speed", type=float, default=20.0, help="the emulator's event time per wall second")
    drill.add_argument("--broker", default=env_broker)
    drill.add_argument("--redis", default=env_redis, help="the Redis of the drills without one of their own")
    drill.add_argument("--json", action="store_true", help="one JSON object per drill instead of the table")
    drill.set_defaults(func=cmd_drill)

    status = sub.add_parser("status", help="a running worker's tenants: share, fair share, the policy's key, rank")
    status.add_argument("--cluster", default="default")
    status.add_argument("--redis", default=env_redis)
    status.add_argument("--app-id", default=worker_defaults.app_id)
    status.add_argument("--json", action="store_true", help="the API's document instead of the table")
    status.set_defaults(func=cmd_status)

    pending = sub.add_parser("pending", help="why tasks wait in a running worker's cluster (paged)")
    pending.add_argument("--cluster", default="default")
    pending.add_argument("--tenant", help="one tenant's pending tasks")
    pending.add_argument("--task", help="one task: its position and why it waits")
    pending.add_argument("--page", type=positive_int, default=1)
    pending.add_argument("--size", type=positive_int, default=50, help="entries per page (at most 1000)")
    pending.add_argument("--reason", help="only tasks waiting for this reason (behind_tenants, reservation, ...)")
    pending.add_argument("--no-group", action="store_true",
                         help="one row per entry (default: alike entries of a tenant, e.g. tasks preempted from one "
                              "request, are one row with a count)")
    pending.add_argument("--redis", default=env_redis)
    pending.add_argument("--app-id", default=worker_defaults.app_id)
    pending.add_argument("--json", action="store_true", help="the API's document instead of the table")
    pending.set_defaults(func=cmd_pending)

    export = sub.add_parser("export-log", help="write a cluster's recorded worker input (for simulate --events)")
    export.add_argument("--cluster", required=True)
    export.add_argument("--redis", default=env_redis)
    export.add_argument("--app-id", default=worker_defaults.app_id)
    export.add_argument("--out", default="-")
    export.add_argument("--snapshot-out", help="where to write the engine the kept log starts from, when "
                                               "--log-retention trimmed its head (for simulate --events --snapshot)")
    export.set_defaults(func=cmd_export_log)

    bench = sub.add_parser(
        "bench", parents=[progress], help="benchmarks (JSON on stdout)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmarks, JSON on stdout (docs/benchmarks.md has the figures and how they were taken):\n"
                    "  engine  the engine alone, microseconds per decision (percentiles): --tenants, --nodes, --pending\n"
                    "          tasks waiting, per policy (--policies, --knob-policies), and a trace (--trace)\n"
                    "  e2e     the busy workload (100 queues, 1,000 nodes, 50,000 tasks) through simulate:\n"
                    "          placed tasks per second, and the same placements with times divided by 10\n"
                    "  day     both SWIM samples as one day times --scale on --day-nodes nodes: wall time,\n"
                    "          input events and engine steps per second, peak memory, per policy in a\n"
                    "          fresh process\n"
                    "  stream  the worker on a real Kafka and Redis (scripts/services.sh): events per second\n"
                    "          and decision latency at --rate for --duration\n"
                    "  kubernetes  fairstream (worker and connector) beside kube-scheduler on a real control\n"
                    "          plane (scripts/kube.sh) with --kube-nodes kwok nodes: pods bound per second and\n"
                    "          creation-to-binding latency for --kube-pods at once and at --kube-rate a second,\n"
                    "          and the share each of two queues (2:1) holds when they ask for more than fits\n"
                    "  spread  every policy (--policies all) on the Philly workload and a large GPU cluster\n"
                    "          (--workloads philly,gpu), each in a fresh process, --repeat times: wall seconds,\n"
                    "          the ratio to the slowest of fair/drf/ltrf, and a hash of the decisions")
    bench.add_argument("target", choices=["engine", "stream", "day", "e2e", "kubernetes", "spread"])
    bench.add_argument("--workloads", default="all", help="spread: philly, gpu, or all")
    bench.add_argument("--repeat", type=positive_int, default=1, help="spread: rounds of every policy, in turn")
    bench.add_argument("--kube-nodes", type=positive_int, default=1000, help="kubernetes: kwok nodes of 32 cores")
    bench.add_argument("--kube-pods", type=positive_int, default=10000, help="kubernetes: pods of the burst")
    bench.add_argument("--kube-rate", type=float, default=100.0, help="kubernetes: pods made a second (rate phase)")
    bench.add_argument("--kube-rate-seconds", type=float, default=30.0, help="kubernetes: seconds of the rate phase")
    bench.add_argument("--kube-fair-pods", type=int, default=None,
                       help="kubernetes: pods of 16 cores in the fairness phase (default 3 x --kube-nodes)")
    bench.add_argument("--schedulers", default="fairstream,kube-scheduler", help="kubernetes: which to measure")
    bench.add_argument("--kube-phases", default="burst,rate,fairness", help="kubernetes: which phases")
    bench.add_argument("--kube-no-finalizer", action="store_true",
                       help="kubernetes: the connector with --no-finalizer (one API write less a pod)")
    bench.add_argument("--kube-scheduler-qps", type=float, default=None,
                       help="kubernetes: kube-scheduler's API queries a second (default: its own, 50)")
    bench.add_argument("--durations", choices=["per-task", "per-job"], default="per-task",
                       help="e2e: one run time per task (jobs submitted task by task) or per job (one request each)")
    bench.add_argument("--no-time-check", action="store_true",
                       help="e2e: skip the second run with every time divided by 10")
    bench.add_argument("--scale", type=float, default=1.0,
                       help="day: multiply the SWIM byte counts (16: about 15 million tasks)")
    bench.add_argument("--day-nodes", type=int, default=50, help="day: nodes of <12 cpu, 24 GB>")
    bench.add_argument("--hours", type=float, default=None, help="day: only the jobs of the first HOURS hours (default: all)")
    bench.add_argument("--rate", type=float, default=5000, help="stream: input events per second")
    bench.add_argument("--rates", type=_rates, default=None,
                       help="stream: one run per rate, e.g. 1000,2500,5000,10000 (the saturation curve)")
    bench.add_argument("--duration", type=float, default=60, help="stream: seconds of load (600 for the memory check)")
    bench.add_argument("--stream-nodes", type=int, default=200)
    bench.add_argument("--stream-tenants", type=int, default=100)
    bench.add_argument("--retention", type=float, default=worker_defaults.finished_retention, help="stream: the worker's --finished-retention")
    bench.add_argument("--batch-window", type=float, default=worker_defaults.batch_window, help="stream: the worker's --batch-window")
    bench.add_argument("--worker-args", default="",
                       help="stream: more options for the worker, e.g. \"--step-window 0.01 --fetch-min-bytes 1\"")
    bench.add_argument("--send-interval", type=float, default=0.005,
                       help="stream: seconds between the load generator's sends (what is due goes as one record batch per topic)")
    bench.add_argument("--events-per-message", type=int, default=1,
                       help="stream: up to this many events of one topic per Kafka message (a JSON array); 1: one event each")
    bench.add_argument("--tenant-count", type=int, default=1000, dest="tenants", help="engine: tenants")
    bench.add_argument("--nodes", type=int, default=10000)
    bench.add_argument("--pending", type=int, default=100000)
    bench.add_argument("--policies", default="ltrf,drf,fair")
    bench.add_argument("--knob-policies", default="qknobler,tetris",
                       help="engine: policies measured at 100 tenants x 3 resources x 100 nodes ('' to skip)")
    bench.add_argument("--trace", help="engine: SWIM trace to time a whole simulation of (default: the FB-2009 sample "
                                       "if found; none: skip it)")
    bench.set_defaults(func=cmd_bench)
    return parser


# What ``fairstream[lab]`` adds (pyproject.toml): plots, progress bars, FLEX training.
LAB_MODULES = ("matplotlib", "tqdm", "sklearn")


def main(argv: list[str] | None = None) -> int:
    from fairstream.logs import configure

    configure()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "worker":
        # aiokafka logs a failed connection itself before raising it; the command's one error
        # line (main) says the same. The worker keeps them: it retries, and they say why.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        if args.command == "worker":  # (it tunes the collector itself, once Faust is loaded)
            return args.func(args)
        with tuned_gc():  # the worker's settings: the engine runs alike in both drivers
            return args.func(args)
    except ModelError as exc:
        print(f"fairstream: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in LAB_MODULES:
            raise
        instead = " (or --no-plots)" if hasattr(args, "no_plots") and (exc.name or "").startswith("matplotlib") else ""
        print(f"fairstream: error: {args.command} needs {exc.name}, which comes with fairstream's lab extra: "
              f"pip install 'fairstream[lab]'{instead}", file=sys.stderr)
        return 2
    except ValueError as exc:  # parameter conversions outside the model
        print(f"fairstream: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): what it wanted it has; say nothing
        # Python would complain again flushing stdout at exit: point it at nothing first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # output directory not writable, disk full, ...
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"fairstream: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        unreachable = _unreachable(exc)
        if unreachable is None:
            raise
        print(f"fairstream: error: {unreachable}", file=sys.stderr)
        return 2


def _delivery_timeout_option(parser) -> None:
    parser.add_argument("--delivery-timeout", type=positive_seconds, default=None, dest="delivery_timeout",
                        help="seconds a message may wait for the broker (an outage is ridden out, nothing is sent "
                             "twice) before the command gives up saying what it could not send "
                             "(default: FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT, else 120)")


def _unreachable(exc: Exception) -> str | None:
    """One line for a Kafka broker or Redis server the command could not use (a wrong
    address, a service that is down, credentials it refused), else None."""
    from aiokafka.errors import KafkaError
    from redis.exceptions import RedisError

    text = str(exc) if str(exc).startswith(type(exc).__name__) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, KafkaError):
        return f"Kafka: {text} (check --broker / FAIRSTREAM_BROKER and FAIRSTREAM_KAFKA_*)"
    if isinstance(exc, RedisError):
        return f"Redis: {text} (check --redis / FAIRSTREAM_REDIS_URL)"
    return None


if __name__ == "__main__":
    sys.exit(main())
