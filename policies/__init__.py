"""The policy registry: every policy by name, with one signature.

``decide(snapshot, params) -> list[Decision]``; see ``policies.base`` for the contract.
"""

from __future__ import annotations

from fairstream.core.model import ModelError
from fairstream.policies import (
    cdrf,
    drf,
    drfh,
    fair,
    fifo,
    flex,
    hltrf,
    ltrf,
    perf,
    pmdrf,
    qknobler,
    static,
    tetris,
    tsf,
)
from fairstream.policies.base import PolicySpec

REGISTRY: dict[str, PolicySpec] = {
    spec.name: spec for spec in (fifo.SPEC, fair.SPEC, drf.SPEC, static.SPEC, ltrf.SPEC, hltrf.SPEC,
                                  qknobler.SPEC, tetris.SPEC, tsf.SPEC, pmdrf.SPEC, drfh.SPEC, cdrf.SPEC,
                                  perf.SPEC, flex.SPEC)
}


def get(name: str) -> PolicySpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelError(f"--policy {name}: unknown policy (known: {', '.join(REGISTRY)})") from None
