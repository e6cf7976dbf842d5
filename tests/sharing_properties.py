"""Sharing properties of one allocation, checked by brute force on small instances (TSF paper
section 2): sharing incentive (SI), envy-freeness (EF), Pareto optimality (PO) and
strategy-proofness (SP), for jobs with one task shape each, weight 1, more tasks than fit.

An instance is machines (capacity vectors) and jobs (a demand vector and the machines they may
use). ``allocate(policy, instance)`` runs one scheduling pass of the engine on an empty cluster
and returns tasks per (job, machine).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

from fairstream.model import DecisionKind
from fairstream.solver import solve_packing
from tests.builders import engine, node, submit, tree

TASKS = 60  # per job: more than any instance here can hold


@dataclass(frozen=True)
class Instance:
    machines: tuple[tuple[int, int], ...]
    demands: tuple[tuple[int, int], ...]
    allowed: tuple[frozenset[int], ...]

    def describe(self) -> str:
        jobs = [f"j{i}: {d} on {sorted(a)}" for i, (d, a) in enumerate(zip(self.demands, self.allowed))]
        return f"machines {list(self.machines)}; " + "; ".join(jobs)


def random_instance(rng: random.Random, low: int = 12, high: int = 30) -> Instance:
    machines = tuple((rng.randint(low, high), rng.randint(low, high)) for _ in range(rng.randint(1, 3)))
    jobs = rng.randint(2, 3)
    demands = tuple((rng.randint(1, 4), rng.randint(1, 4)) for _ in range(jobs))
    allowed = tuple(frozenset(m for m in range(len(machines)) if rng.random() < 0.7) or frozenset({0})
                    for _ in range(jobs))
    return Instance(machines, demands, allowed)


def allocate(policy: str, instance: Instance, demands=None, allowed=None) -> np.ndarray:
    """Tasks per (job, machine) after one pass; ``demands``/``allowed`` override what jobs report."""
    demands = demands or instance.demands
    allowed = allowed or instance.allowed
    jobs = [f"j{i}" for i in range(len(demands))]
    e = engine(tree(*jobs), policy, ("cpu", "mem"))
    events = [node(f"m{m}", cpu=c, mem=g) for m, (c, g) in enumerate(instance.machines)]
    for i, job in enumerate(jobs):
        constraints = {"nodes": [f"m{m}" for m in sorted(allowed[i])]}
        events += [submit(f"{job}-{t}", job, constraints=constraints, cpu=demands[i][0], mem=demands[i][1])
                   for t in range(TASKS)]
    counts = np.zeros((len(jobs), len(instance.machines)), dtype=int)
    for d in e.step(0.0, events).decisions:
        if d.kind is DecisionKind.PLACE:
            counts[int(d.tenant[1:]), int(d.node[1:])] += 1
    return counts


def fit(resources, demand) -> int:
    return min(int(math.floor(r / d + 1e-9)) for r, d in zip(resources, demand))


def sharing_incentive(instance: Instance, counts: np.ndarray) -> str | None:
    """Each job runs at least what it would in its dedicated pool: 1/n of every machine."""
    n = len(instance.demands)
    for i, (demand, allowed) in enumerate(zip(instance.demands, instance.allowed)):
        alone = sum(fit([c / n for c in instance.machines[m]], demand) for m in allowed)
        if counts[i].sum() < alone:
            return f"j{i} runs {counts[i].sum()} < {alone} in its 1/{n} pool"
    return None


def envy_free(instance: Instance, counts: np.ndarray) -> str | None:
    """No job could run more tasks with another's allocation (on the machines it may use)."""
    for i, j in itertools.permutations(range(len(instance.demands)), 2):
        bundle = {m: [counts[j, m] * r for r in instance.demands[j]] for m in range(len(instance.machines))}
        with_theirs = sum(fit(bundle[m], instance.demands[i]) for m in instance.allowed[i])
        if with_theirs > counts[i].sum():
            return f"j{i} runs {counts[i].sum()} but would run {with_theirs} with j{j}'s allocation"
    return None


def pareto_optimal(instance: Instance, counts: np.ndarray) -> str | None:
    """No allocation gives every job at least as many tasks and one more (exact integer program)."""
    jobs, machines = len(instance.demands), len(instance.machines)
    items = [(i, m) for i in range(jobs) for m in sorted(instance.allowed[i])]
    values = np.ones(len(items))
    demands = np.zeros((len(items), 2 * machines))
    for k, (i, m) in enumerate(items):
        demands[k, 2 * m: 2 * m + 2] = instance.demands[i]
    capacity = np.array([c for machine in instance.machines for c in machine], dtype=float)

    def at_least_as_many(problem, variables):
        for i in range(jobs):
            problem += sum(v for v, (owner, _) in zip(variables, items) if owner == i) >= int(counts[i].sum())

    best = solve_packing(values, demands, capacity, np.full(len(items), TASKS), extra=at_least_as_many)
    if best.objective > counts.sum() + 1e-6:
        return f"{int(best.objective)} tasks possible with nobody worse off, {counts.sum()} placed"
    return None


def strategy_proof(policy: str, instance: Instance, counts: np.ndarray) -> str | None:
    """No job runs more (true) tasks by inflating a demand or by declaring other machines."""
    machines = range(len(instance.machines))
    for i, (demand, allowed) in enumerate(zip(instance.demands, instance.allowed)):
        honest = counts[i].sum()
        lies = [("demand", tuple(d + (k == r) for k, d in enumerate(demand)), allowed) for r in range(2)]
        lies += [("constraints", demand, frozenset(s)) for size in range(1, len(instance.machines) + 1)
                 for s in itertools.combinations(machines, size) if frozenset(s) != allowed]
        for what, told_demand, told_allowed in lies:
            demands = tuple(told_demand if k == i else d for k, d in enumerate(instance.demands))
            allowed_all = tuple(told_allowed if k == i else a for k, a in enumerate(instance.allowed))
            lied = allocate(policy, instance, demands, allowed_all)
            useful = sum(lied[i, m] for m in allowed)  # tasks on machines it can really use
            if useful > honest:
                return f"j{i} runs {useful} > {honest} by misreporting its {what} ({told_demand} on {sorted(told_allowed)})"
    return None


CHECKS = {"SI": sharing_incentive, "EF": envy_free, "PO": pareto_optimal}


def violations(policy: str, instance: Instance) -> dict[str, str]:
    counts = allocate(policy, instance)
    found = {name: why for name, check in CHECKS.items() if (why := check(instance, counts))}
    if (why := strategy_proof(policy, instance, counts)):
        found["SP"] = why
    return found
