"""Writing a run to disk: decisions.jsonl, metrics.json and plots; ``staged``: a run's output
folder put in place only when the run succeeds."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from fairstream.sim.metrics import job_statistics
from fairstream.sim.simulator import SimResult
from fairstream.wire import jsoncodec


def _clean(value):
    """JSON has no inf or NaN: they become null."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def speedups(result: SimResult, baseline: SimResult) -> dict:
    """Per-tenant makespan and mean-JCT speedup of ``result`` over ``baseline`` (static)."""
    ours, theirs = result.summary()["tenants"], baseline.summary()["tenants"]
    out = {}
    for tenant, base in theirs.items():
        mine = ours.get(tenant, {})
        out[tenant] = {
            "makespan": (base["makespan"] / mine["makespan"]) if base.get("makespan") and mine.get("makespan") else None,
            "mean_jct": (base["mean_jct"] / mine["mean_jct"]) if base.get("mean_jct") and mine.get("mean_jct") else None,
        }
    total_base, total = baseline.summary()["makespan"], result.summary()["makespan"]
    return {"tenants": out, "overall_makespan": (total_base / total) if total_base and total else None}


def metrics_document(result: SimResult, baseline: SimResult | None = None, theory: dict | None = None) -> dict:
    """What ``metrics.json`` holds, inf and NaN as None."""
    return _clean(_document(result, baseline, theory))


def _document(result: SimResult, baseline: SimResult | None, theory: dict | None) -> dict:
    """``metrics_document`` with inf and NaN as they are."""
    m = result.metrics
    jobs, _ = job_statistics(result.jobs)
    doc = {
        "summary": result.summary(),
        "sample_interval": m.sample_interval,
        "tenants": {name: vars(series) for name, series in sorted(m.series.items())},
        "cluster": m.cluster,
        "jobs": {
            name: {"tenant": job["tenant"], "tasks": job["tasks"], "submit": job["submit"],
                   "finish": job["finish"] if job["done"] else None, "completion_time": job["completion_time"]}
            for name, job in sorted(jobs.items())
        },
    }
    if baseline is not None:
        doc["speedup_vs_static"] = speedups(result, baseline)
    if theory is not None:
        doc["knob_theory"] = theory
    return doc


class DecisionWriter:
    """Writes decisions to ``decisions.jsonl`` as a run takes them (``Simulator(on_decision=)``),
    so a day-long run never holds them all; one compact JSON document per line, encoded as the
    worker encodes the decisions it publishes (``wire.jsoncodec``)."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.handle = open(out / "decisions.jsonl", "wb")

    def __call__(self, decision) -> None:
        self.handle.write(jsoncodec.dumps_line(decision.to_json()))

    def close(self) -> None:
        self.handle.close()


def write_run(result: SimResult, out: Path, baseline: SimResult | None = None, plots: bool = True,
              theory: dict | None = None, decisions_written: bool = False) -> list[Path]:
    """Write ``result`` to ``out``; ``decisions_written``: a ``DecisionWriter`` wrote
    decisions.jsonl during the run."""
    out.mkdir(parents=True, exist_ok=True)
    if not decisions_written:
        writer = DecisionWriter(out)
        for decision in result.decisions:
            writer(decision)
        writer.close()
    # (``dumps_document`` writes inf and NaN as null, as ``_clean`` makes them: the document is
    # not walked in Python first, a tenth of a second on a busy run's series)
    (out / "metrics.json").write_bytes(jsoncodec.dumps_document(_document(result, baseline, theory)))
    written = [out / "decisions.jsonl", out / "metrics.json"]
    if plots:
        from fairstream.sim.plots import plot_run

        written += plot_run(result, out)
    return written


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A folder to write a run's output into, put in place at ``out`` when the ``with`` block
    ends without an error: each file or folder it holds replaces the one of that name in
    ``out`` (others in ``out`` are left as they are). A run that fails or is interrupted
    leaves ``out`` as it was: a failed command once cut a good decisions.jsonl to nothing and
    left the old metrics.json and plots beside it. The folder is a hidden sibling of ``out``
    (``.<name>.partial-<pid>``), so moving it into place is a rename on the same file system."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(20, "--out is a file, not a folder", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not out.exists():
        staging.rename(out)
        return
    for entry in sorted(staging.iterdir()):
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        entry.rename(target)
    staging.rmdir()


def write_csv(rows: list[dict], fields: tuple[str, ...], path: Path) -> Path:
    """``rows`` as CSV with the columns ``fields`` (a missing field is empty)."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in fields})
    return path

