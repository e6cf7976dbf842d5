"""The compiled hot path, when it is built: ``fairstream._native``, from the Rust crate in
``native/`` (``pip install -e .`` builds it with setuptools-rust and cargo; without a Rust
toolchain the install goes on without it and every pass runs in Python).

What it does today (docs/architecture.md, "The compiled path"): the pass of the flat fair
policies (``drf``, ``fair``, ``ltrf``) when none of the pass's other features is in play
(``placement.serve_in_order``), the engine's candidate-shape scan and choice of a node to
reserve, the accounting's usage integral, and the simulator's per-step metrics. The Python stays the reference:
``tests/core/test_native.py`` checks the two decide and measure alike.
``FAIRSTREAM_NATIVE=0`` in the environment, or ``set_enabled(False)``, turns it off;
``FAIRSTREAM_NATIVE_PASS=0`` turns off the pass alone.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import fairstream._native as _built
except ImportError:  # not built (no Rust toolchain at install time)
    _built = None
module: Any = _built  # (an extension module: no types to check its calls against)

_enabled = module is not None and os.environ.get("FAIRSTREAM_NATIVE", "1") != "0"
# ``FAIRSTREAM_NATIVE_PASS=0``: every pass in Python, the rest compiled (how the compiled pass's
# gain is measured, and must stay measured: docs/architecture.md, "The compiled path").
_pass = os.environ.get("FAIRSTREAM_NATIVE_PASS", "1") != "0"


def enabled() -> bool:
    """Whether passes may use the compiled path."""
    return _enabled


def pass_enabled() -> bool:
    """Whether a flat pass may run compiled (``serve_flat``): the compiled path is on and
    ``FAIRSTREAM_NATIVE_PASS=0`` is not set."""
    return _enabled and _pass


def set_enabled(flag: bool) -> bool:
    """Turn the compiled path on or off (on only if built); returns the previous setting."""
    global _enabled
    before, _enabled = _enabled, bool(flag) and module is not None
    return before


__all__ = ["enabled", "pass_enabled", "set_enabled", "module"]
