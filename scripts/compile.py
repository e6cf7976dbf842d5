"""Compile the engine's listed modules with mypyc (``fairstream/compiled.py``) if their build
is not of the sources as they are; says so in one line when it compiles or cannot (silent when
the build is up to date). Run by ``scripts/bootstrap.sh``. Exits 0 also when it could not
compile: everything then runs from source."""

import sys

from fairstream import compiled

try:
    done = compiled.build()
    if done != compiled.UP_TO_DATE:
        print(f"fairstream: {done}", file=sys.stderr)
except (RuntimeError, OSError) as exc:
    print(f"fairstream: the engine's modules run from source, not compiled ({exc})", file=sys.stderr)
