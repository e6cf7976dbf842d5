"""The one contract every policy implements, and typed parameters.

A policy is a pure function ``decide(snapshot, params) -> list[Decision]``: no Redis, Kafka,
clock or logging inside. It is registered by name in ``fairstream.policies.REGISTRY`` as a
``PolicySpec``: its parameters, their defaults and their documentation (so ``--param
name=value`` is checked in one place and ``fairstream policies`` can list them), and three
small records a newcomer can skip until needed: ``Ordering`` (how it chooses, for
explanations), ``Needs`` (the accounting and preemption rule the engine keeps for it) and
``Traits`` (what the engine may assume of its passes). A flat policy's pass is usually one call
of ``placement.serve_in_order`` with a ``placement.Service``: its key, its reason, its charge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fairstream.core.accounting import AccountingConfig
from fairstream.core.model import Decision, ModelError, ResourceSpace
from fairstream.core.placement import TenantOrder
from fairstream.core.preemption import PreemptionRule
from fairstream.core.snapshot import Snapshot


def parse_float(text: str) -> float:
    value = float(text)
    if math.isnan(value):
        raise ValueError("NaN")
    return value


def parse_positive(text: str) -> float:
    value = parse_float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def parse_non_negative(text: str) -> float:
    value = parse_float(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def parse_fraction(text: str) -> float:
    value = parse_float(text)
    if not 0 <= value <= 1:
        raise ValueError("must be in [0, 1]")
    return value


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


def parse_name(text: str) -> str:
    if not text:
        raise ValueError("empty")
    return text


@dataclass(frozen=True)
class Param:
    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    # The parsed value as JSON, for a run's record (metrics.json): by default the value itself,
    # infinity as null; a parameter parsed into an object (FLEX's model) says how it was given.
    show: Callable[[Any], Any] | None = None

    def to_json(self, value: Any) -> Any:
        if self.show is not None:
            return self.show(value)
        return None if isinstance(value, float) and math.isinf(value) else value


@dataclass(frozen=True)
class Ordering:
    """How the policy chooses among tenants, as ``fairstream.core.explain`` tells a waiting task
    and the operator's page shows it; nothing here changes a decision.

    - ``order(snapshot, params)``: its order of tenants (``placement.TenantOrder``), the key its
      own pass serves by. None: DRF's order stands in (``placement.dominant_share_order``), and
      ``explain`` says so.
    - ``quota(snapshot, params)``: a per-tenant quota its pass checks before placing (static's
      partition): the returned ``(cycle, tenant, task)`` is False for a task over it.
    - ``efficiency``: for a policy whose choice also weighs packing (Tetris, QKnobler, FLEX), a
      sentence saying who gets freed room, told a waiting task instead of "behind tenants".
    - ``victims``: (label, make key) when its preemption stage picks victims by a key of its
      own (LTRF's long-term usage; ``preemption.reclaim``'s ``victim_key``, made from the
      snapshot): a victim must then have a higher key than the starved tenant, which
      ``explain`` tells a tenant waiting for its timeout. None: the share ratio (any tenant
      above its fair share may be a victim)."""

    order: Callable[[Snapshot, Mapping[str, Any]], TenantOrder] | None = None
    quota: Callable[[Snapshot, Mapping[str, Any]], Callable] | None = None
    efficiency: str | None = None
    victims: tuple[str, Callable[[Snapshot], Callable[[str, Any], float]]] | None = None


@dataclass(frozen=True)
class Needs:
    """What the engine keeps for the policy, made from its typed parameters.

    - ``accounting(resources, params)``: the accumulated-usage accounting it reads
      (``Snapshot.accounting``); raises ModelError for a parameter the cluster cannot honour (a
      resource it does not have). None: the defaults, which memoryless policies never read.
    - ``preemption(params)``: the preemption rule its parameters ask for
      (``core/preemption.py``), or None when off; the engine then watches for starved tenants."""

    accounting: Callable[[ResourceSpace, Mapping[str, Any]], AccountingConfig] | None = None
    preemption: Callable[[Mapping[str, Any]], PreemptionRule | None] | None = None


@dataclass(frozen=True)
class Traits:
    """What the engine may assume of the policy's passes, or must build for them: every flag
    the engine branches on on a policy's behalf, declared here and nowhere else.

    - ``tenant_local``: its pass serves tenants one task at a time by keys of each tenant's own
      state until no pending task fits (``placement.serve_in_order`` without caps or quotas). A
      tenant none of whose tasks fits any node then cannot change the pass, so the engine may
      leave out the tenants that placed nothing last time and still fit none of the nodes that
      gained room since (``Snapshot.candidates``): a pass costs what changed.
    - ``hierarchical``: it walks the tenant tree queue by queue (hltrf), so a queue's
      ``ordering`` of its children applies; flat policies refuse one.
    - ``node_allocation``: it reads what each tenant runs on each node
      (``Snapshot.node_allocation``), which the engine then makes for the nodes it reads."""

    tenant_local: bool = False
    hierarchical: bool = False
    node_allocation: bool = False


@dataclass(frozen=True)
class PolicySpec:
    """A registered policy: its name, pure ``decide`` function, a one-line ``summary``, typed
    ``params`` (``check`` checks them together, and may complete them in place: FLEX loads its
    model file; raises ModelError), and three small records: how it chooses among tenants
    (``ordering``, for explanations), what the engine keeps for it (``needs``), and what the
    engine may assume of its passes (``traits``)."""

    name: str
    decide: Callable[[Snapshot, Mapping[str, Any]], list[Decision]]
    summary: str
    params: tuple[Param, ...] = field(default_factory=tuple)
    check: Callable[[dict[str, Any]], Any] | None = None  # (may complete the parsed values: FLEX loads its model)
    ordering: Ordering = Ordering()
    needs: Needs = Needs()
    traits: Traits = Traits()

    def parse_params(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Typed parameters from ``{"quantum": "600"}``; unknown names or bad values raise
        ``ModelError`` with a one-line message naming the parameter."""
        known = {p.name: p for p in self.params}
        out = {p.name: p.default for p in self.params}
        for name, value in raw.items():
            if name not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ModelError(f"--param {name}: unknown parameter for policy {self.name!r} (known: {names})")
            try:
                out[name] = known[name].parse(str(value))
            except ValueError as exc:
                raise ModelError(f"--param {name}={value}: {exc}") from None
        if self.check is not None:
            self.check(out)
        return out

    def accounting_config(self, resources: ResourceSpace, params: Mapping[str, Any]) -> AccountingConfig:
        """The accounting this policy needs on a cluster of ``resources`` with its typed ``params``."""
        return AccountingConfig() if self.needs.accounting is None else self.needs.accounting(resources, params)

    def preemption_rule(self, params: Mapping[str, Any]) -> PreemptionRule | None:
        """The preemption rule of this policy with typed ``params``, None if it has none or it is off."""
        return None if self.needs.preemption is None else self.needs.preemption(params)

    def params_json(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Typed parameters (from ``parse_params``) as JSON, each as its ``Param`` shows it."""
        shown = {p.name: p for p in self.params}
        return {name: shown[name].to_json(value) if name in shown else value for name, value in params.items()}


def parse_param_pairs(pairs: list[str] | None) -> dict[str, str]:
    """``["quantum=600", "round=3600"]`` to a dict; a malformed pair raises ``ModelError``."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ModelError(f"--param {pair!r}: expected name=value")
        out[name.strip()] = value.strip()
    return out
