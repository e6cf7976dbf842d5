"""The engine's node registry: every node seen, by row, with its capacity, what runs on it and
whether it is alive, as node x resource arrays the passes read.

A node keeps its row for good (a lost node is marked dead, not removed), so a row named in a
decision, a reservation or a snapshot stays that node. The arrays have spare rows and grow by
doubling, so joining n nodes costs O(n); ``capacity``, ``used`` and ``alive`` are the sliced
views, ``storage_*`` the arrays themselves for hot paths that index one row.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import cast

import numpy as np

from fairstream.core import native
from fairstream.core.model import EPSILON, Node


class Nodes:
    """The nodes of one cluster (``Engine.registry``). Changes only through ``heartbeat``
    (``join`` or ``update``) and ``lose``, which say what the engine must act on."""

    def __init__(self, n_resources: int = 0) -> None:
        self.nodes: list[Node] = []
        self.row: dict[str, int] = {}  # node id -> row
        self.storage_capacity = np.zeros((0, n_resources))
        self.storage_used = np.zeros((0, n_resources))
        self.storage_alive = np.zeros(0, dtype=bool)
        self.ids: list[str] = []
        self.labels: list[dict[str, str]] = []
        # The snapshot's node ids and read-only labels, made again only when a node joins or
        # its labels change.
        self._view: tuple[tuple[str, ...], tuple[Mapping[str, str], ...]] | None = None
        self.lost = 0  # how many rows are dead (``lose``; a heartbeat revives): the snapshot's free room

    def __deepcopy__(self, memo: dict) -> Nodes:
        # The view holds read-only label mappings, which cannot be copied: the copy makes its own.
        twin = memo[id(self)] = Nodes.__new__(Nodes)
        fields = cast(dict, self.__getstate__())  # (its fields; compiled, it has no __dict__)
        for name, value in fields.items():
            setattr(twin, name, None if name == "_view" else copy.deepcopy(value, memo))
        return twin

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def capacity(self) -> np.ndarray:
        """Node x resource capacity (a view: writes go to the storage)."""
        return self.storage_capacity[: len(self.nodes)]

    @property
    def used(self) -> np.ndarray:
        """Node x resource allocated to running tasks (a view)."""
        return self.storage_used[: len(self.nodes)]

    @property
    def alive(self) -> np.ndarray:
        return self.storage_alive[: len(self.nodes)]

    def view(self) -> tuple[tuple[str, ...], tuple[Mapping[str, str], ...]]:
        """(node ids, their labels read-only), by row: what a snapshot shows of the nodes."""
        if self._view is None:
            self._view = (tuple(self.ids), tuple(MappingProxyType(labels) for labels in self.labels))
        return self._view

    def join(self, node: Node) -> int:
        """Add ``node`` (alive, with its capacity) in the next row; returns the row."""
        row = len(self.nodes)
        self.row[node.id] = row
        self.nodes.append(node)
        self.ids.append(node.id)
        self.labels.append(node.labels)
        self._view = None
        if row >= len(self.storage_capacity):
            size, width = max(16, 2 * len(self.storage_capacity)), self.storage_capacity.shape[1]
            grow = size - len(self.storage_capacity)
            self.storage_capacity = np.vstack([self.storage_capacity, np.zeros((grow, width))])
            self.storage_used = np.vstack([self.storage_used, np.zeros((grow, width))])
            self.storage_alive = np.concatenate([self.storage_alive, np.zeros(grow, dtype=bool)])
        self.storage_capacity[row] = node.capacity
        self.storage_alive[row] = True
        return row

    def heartbeat(self, node_id: str, capacity: np.ndarray, labels: dict[str, str] | None,
                  weights: dict[int, float] | None, time: float) -> tuple[int, bool, bool]:
        """A heartbeat of node ``node_id``: a new node joins, a known one is updated.
        ``labels`` None keeps its labels; ``weights`` (resource index -> weight, LTRF's formula
        9) changes the named resources' weights, the others keep theirs (1 on a new node).
        Returns (its row, its capacity or liveness changed (a new node: True), its labels
        changed)."""
        row = self.row.get(node_id)
        node_weights = None
        if weights is not None:
            old = self.nodes[row].weights if row is not None else None
            node_weights = np.ones(len(capacity)) if old is None else old.copy()
            for index, value in weights.items():
                node_weights[index] = value
            node_weights = None if (node_weights == 1.0).all() else node_weights
            if row is not None:
                self.nodes[row].weights = node_weights
        if row is None:
            return self.join(Node(node_id, capacity, dict(labels or {}), True, time, node_weights)), True, False
        return (row, *self.update(row, capacity, labels, time))

    def update(self, row: int, capacity: np.ndarray, labels: dict[str, str] | None, time: float) -> tuple[bool, bool]:
        """A heartbeat of the node in ``row``: it is alive with ``capacity`` and, unless None,
        ``labels``. Returns (its capacity or liveness changed, its labels changed)."""
        node = self.nodes[row]
        revived = node.alive is False
        changed = revived or not np.array_equal(node.capacity, capacity)
        self.lost -= revived
        node.capacity, node.alive, node.last_heartbeat = capacity, True, time
        relabelled = labels is not None and labels != node.labels
        if labels is not None and relabelled:
            node.labels = labels
            self.labels[row] = labels
            self._view = None
        if changed:
            self.storage_capacity[row] = capacity
            self.storage_alive[row] = True
        return changed, relabelled

    def room_for_some(self, row: int, demands: np.ndarray) -> bool:
        """Whether node ``row`` is alive and some row of ``demands`` fits its free room now."""
        if not self.storage_alive[row]:
            return False
        if native.enabled():  # the same scan, compiled (``native.room_for_some``)
            return native.module.room_for_some(demands, self.storage_capacity[row], self.storage_used[row], EPSILON)
        return bool((demands <= self.storage_capacity[row] - self.storage_used[row] + EPSILON).all(axis=1).any())

    def lose(self, row: int) -> bool:
        """The node in ``row`` is lost: dead (the engine then requeues its tasks, which frees
        what they used). Returns False if it was dead already."""
        node = self.nodes[row]
        if not node.alive:
            return False
        node.alive = False
        self.storage_alive[row] = False
        self.lost += 1
        return True
