"""``fairstream compare-forgetting``: three ways of forgetting accumulated usage on one workload.

The workload is the LTRF paper's Table 1 at cluster scale (``sim/traces/come_and_go.py``): B has
the cluster alone from t = 0, A arrives at ``a_arrives`` and both want all of it until
``contended_until``. Memoryless ``fair`` never pays A back (a third of the work to
``contended_until``); ``ltrf`` with everything remembered (F-LTMM) gives A everything until
their totals are level, so each ends with half. Forgetting moves ``ltrf`` between the two:

- rounds (``round=L``, the paper's S-LTMM, formula 12): usage restarts at every multiple of L;
- discount (``discount=eta``, formula 7): what a tenant holds beyond its share counts at eta;
- half-life (``half_life=h``, Slurm's ``PriorityDecayHalfLife``): usage decays by half every h.

Per variant: A's part of the memory-seconds served until ``contended_until``, the time A's
accumulated usage (as the policy counts it) first reaches B's, and A's allocation over time.
Writes ``forgetting.json``, ``table.md`` and ``forgetting.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: (label, policy, params): the memoryless baseline, F-LTMM, then one setting of each way of
#: forgetting, at a scale comparable to the contention (600 s).
VARIANTS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("fair (memoryless)", "fair", {}),
    ("ltrf, F-LTMM (remembers all)", "ltrf", {}),
    ("ltrf, round=400", "ltrf", {"round": "400"}),
    ("ltrf, discount=0.5", "ltrf", {"discount": "0.5"}),
    ("ltrf, half_life=300", "ltrf", {"half_life": "300"}),
    ("ltrf, half_life=1200", "ltrf", {"half_life": "1200"}),
)


def simulate(variant: tuple[str, str, dict], a_arrives: float, contended_until: float) -> dict:
    from fairstream.sim.simulator import Simulator
    from fairstream.sim.traces.come_and_go import come_and_go

    label, policy, params = variant
    scenario = come_and_go(a_arrives=a_arrives, contended_until=contended_until)
    result = Simulator(scenario, policy, {"resource": "mem", **params}, sample_interval=5.0,
                       on_decision=lambda decision: None).run()
    a, b = result.metrics.series["A"], result.metrics.series["B"]
    times = np.array(a.time)
    until = times <= contended_until
    step = np.diff(times[until], append=contended_until)
    served_a = float(np.sum(np.array(a.g)[until] * step))
    served_b = float(np.sum(np.array(b.g)[until] * step))
    # Level: A's count within a thousandth of B's (equal counts trade places by float dust).
    level = next((t for t, fa, fb in zip(a.time, a.f_policy, b.f_policy)
                  if t > a_arrives and fa >= fb - 1e-3 * abs(fb)), None)
    return {"label": label, "policy": policy, "params": params,
            "a_part": served_a / (served_a + served_b) if served_a + served_b else None, "level_at": level,
            "time": a.time, "a_share": a.g, "a_usage": a.f_policy, "b_usage": b.f_policy}


def compare(out: Path, a_arrives: float = 300.0, contended_until: float = 900.0) -> dict:
    """Run every variant and write the comparison (module docstring); returns it."""
    from fairstream.sim.plots import forgetting_figure

    out.mkdir(parents=True, exist_ok=True)
    rows = [simulate(v, a_arrives, contended_until) for v in VARIANTS]
    document = {"a_arrives": a_arrives, "contended_until": contended_until,
                "rows": [{k: r[k] for k in ("label", "policy", "params", "a_part", "level_at")} for r in rows]}
    (out / "forgetting.json").write_text(json.dumps(document, indent=1))
    lines = ["| policy, forgetting | A's part of the work until contention ends | A's usage level with B's at |",
             "|---|---:|---:|"]
    for r in rows:
        level = "never" if r["level_at"] is None else f"{r['level_at']:,.0f} s"
        lines.append(f"| {r['label']} | {r['a_part']:.3f} | {level} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    document["figure"] = str(forgetting_figure(rows, a_arrives, contended_until, out / "forgetting.png"))
    return document


__all__ = ["VARIANTS", "compare", "simulate"]
