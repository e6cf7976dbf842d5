"""fairstream: a streaming fair-share scheduler."""
__version__ = "0.1.0"
