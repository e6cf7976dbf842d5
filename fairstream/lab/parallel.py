"""Simulations in parallel processes, one per core, with a progress bar (the lab's experiments)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor


def run_all(function: Callable, plan: Sequence, workers: int | None = None, progress: bool | None = None,
            desc: str = "running", unit: str = "run") -> list:
    """``function`` over ``plan`` in parallel processes (``workers``, default one per core);
    results in plan order."""
    from fairstream.sim.simulator import progress_bar

    bar = progress_bar(len(plan), progress, unit=unit, desc=desc)
    results = []
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for result in pool.map(function, plan):
            results.append(result)
            bar.update(1)
    bar.close()
    return results
