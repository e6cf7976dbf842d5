"""Opening a trace file: one opener for every loader, so that a gzip-compressed file is read as
such whatever its name (a copy saved without ``.gz`` once failed with "'utf-8' codec can't
decode byte 0x8b"), and a file that cannot be opened is one ``ModelError`` naming it."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO

GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip member (RFC 1952, 2.3.1)


def is_gzip(path: str | Path) -> bool:
    """Whether the file at ``path`` starts as gzip does (False if it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError:
        return False


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """The trace file at ``path`` for reading text (UTF-8), decompressed as it is read when it is
    gzip-compressed (by its first bytes, not its name); ``newline`` as ``open``'s (``""`` for
    ``csv``). Raises ``ModelError`` "cannot read" with the system's reason."""
    from fairstream.core.model import ModelError

    try:
        if is_gzip(path):
            return gzip.open(path, "rt", newline=newline, encoding="utf-8")
        return open(path, newline=newline, encoding="utf-8")
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror or exc})") from None


REPOSITORY = Path(__file__).resolve().parents[3]
WORKSPACE_TRACES = REPOSITORY.parent / "shared" / "traces"  # where this project's workspace keeps whole traces
EXCERPTS = REPOSITORY / "tests" / "data"  # the excerpts every clone has (tests/data/README.md)


def whole_or_excerpt(whole: str, excerpt: str) -> Path:
    """A command's default trace: the whole public trace ``whole`` (a path under
    ``../shared/traces``, beside this project's checkout in its workspace) where it is there,
    else the excerpt ``excerpt`` every clone has in ``tests/data``, so that the default runs in a
    user's clone too (an installed package has neither: the command then says it cannot read it)."""
    path = WORKSPACE_TRACES / whole
    return path if path.exists() else EXCERPTS / excerpt
