"""Fixed vs adaptive task quantum (ICS'14 section 6.5, Figure 7): with a 600 s quantum and
~11 s tasks, the accumulated usage LTRF orders by jumps up by 600 s per task when a burst
starts and drops when the burst finishes (Figure 7a: 1019 -> 630 in 11 s); the Quantum Updater
brings the quantum down to the real task time and the curve has no drops (Figure 7b)."""

import numpy as np
import pytest

from builders import scenario
from fairstream.sim.simulator import Simulator


def bursty_facebook_like(seed: int = 7):
    # Jobs of 100 tasks every 30 s for 10 minutes; tasks run 10-12 s (mean 11 s, as FB's).
    rng = np.random.default_rng(seed)
    tasks = []
    for job in range(20):
        for k in range(100):
            tasks.append({"id": f"j{job}-{k}", "job": f"j{job}", "tenant": "Facebook", "submit": 30 * job,
                          "duration": float(rng.uniform(10, 12)), "demand": {"mem": 1}})
    return scenario(resources=["mem"], nodes=[{"id": "n", "capacity": {"mem": 200}}],
                    tenants=[{"id": "Facebook"}, {"id": "Other"}], tasks=tasks)


def accumulated_series(mode: str):
    result = Simulator(bursty_facebook_like(), "ltrf", {"quantum": "600", "quantum_mode": mode}, sample_interval=1.0).run()
    series = result.metrics.series["Facebook"]
    return np.array(series.time), np.array(series.f_policy), result


def largest_drop(time, values, after: float) -> float:
    keep = time >= after
    v = values[keep]
    drops = (v[:-1] - v[1:]) / np.maximum(v[:-1], 1e-12)
    return float(drops.max())


def test_fixed_600s_quantum_makes_accumulated_usage_drop_when_a_burst_finishes():
    time, values, _ = accumulated_series("fixed")
    # A burst of 100 tasks counts 100 * 600 on start, then 100 * ~11 when it finishes.
    assert largest_drop(time, values, after=60) > 0.5


def test_adaptive_quantum_has_no_drops_once_tuned():
    time, values, result = accumulated_series("adaptive")
    # Warm-up: the very first burst still starts at 600 s per task until its tasks finish.
    # After it, a task ending before its (mean) quantum gives back its unused part of the
    # quantum: drops of well under 1 % remain where a burst ends, against over 50 % fixed.
    assert largest_drop(time, values, after=15) < 0.02
    assert result.metrics.engine.accounting.quantum(0) == pytest.approx(11, abs=0.2)
