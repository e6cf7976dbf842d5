"""The topics of one deployment: four inputs keyed by cluster id, decisions, dead letters, and
the worker's journal of what it applied (``streams/journal.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topics:
    submitted: str = "tasks.submitted"
    completed: str = "tasks.completed"
    heartbeats: str = "nodes.heartbeats"
    decisions: str = "allocations.decisions"
    deadletter: str = "events.deadletter"
    config: str = "tenants.config"  # a cluster's tenant tree, changed while it runs
    journal: str = "worker.journal"  # the batches the worker applied, in order: for a rebuild

    def with_prefix(self, prefix: str) -> Topics:
        """``prefix.tasks.submitted`` and so on: several deployments on one Kafka."""
        if not prefix:
            return self
        return Topics(**{name: f"{prefix}.{getattr(self, name)}" for name in self.__dataclass_fields__})

    @property
    def inputs(self) -> tuple[str, str, str, str]:
        """The topics the worker consumes, keyed by cluster id: they must have one partition
        count, so that a cluster's events of every kind meet in one worker."""
        return (self.submitted, self.completed, self.heartbeats, self.config)

    @property
    def names(self) -> tuple[str, ...]:
        """Every topic the worker reads or writes."""
        return (*self.inputs, self.decisions, self.deadletter, self.journal)
