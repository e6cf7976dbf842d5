"""Workloads: loaders for real traces (SWIM Facebook 2009, Google 2011, Philly run times, any
table through a column mapping) and
the seeded generators (the LTRF papers' four-queue macro-benchmark, tenants arriving to a busy
cluster). Each returns a ``Scenario``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairstream.core.model import ModelError

if TYPE_CHECKING:  # (a command's parser imports ``traces.files``: the package stays light)
    from fairstream.sim.scenario import Scenario

FORMATS = ("swim", "google", "philly", "table")


def load_trace(path: str, fmt: str, **options) -> Scenario:
    if fmt == "swim":
        from fairstream.sim.traces.swim import load_swim

        return load_swim(path, **options)
    if fmt == "google":
        from fairstream.sim.traces.google import load_google

        return load_google(path, **options)
    if fmt == "philly":
        from fairstream.sim.traces.late_tenants import load_philly

        return load_philly(path, **options)
    if fmt == "table":
        from fairstream.sim.traces.table import load_table

        if options.get("mapping") is None:
            raise ModelError("--format table needs --mapping FILE (or a shipped one: alibaba-2017, google-2011, philly)")
        return load_table(path, **options)
    raise ModelError(f"--format {fmt}: unknown trace format (known: {', '.join(FORMATS)})")
