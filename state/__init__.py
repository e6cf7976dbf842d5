"""fairstream.state: where the streaming worker keeps engine state.

A small interface with an in-memory implementation and a Redis one: per-tenant windowed
accumulated usage and adaptive quanta, task and node registries, tenant configuration; read
once per scheduling pass, written in pipelines. The simulator keeps the same state in the
engine's own objects (``fairstream.core.accounting``, ``fairstream.core.engine``).
"""
