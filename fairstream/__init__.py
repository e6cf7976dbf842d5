"""fairstream: a streaming fair-share scheduler."""
__version__ = "0.1.0"

from fairstream import compiled as _compiled

_compiled.install()  # the engine's modules compiled with mypyc, if built from these sources
