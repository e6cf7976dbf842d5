"""fairstream.streams: the Faust worker (``fairstream worker``; docs/architecture.md).

A thin adapter: decode and validate an event from Kafka, call ``Engine.step``, publish the
decisions; events the engine rejects go to the dead-letter topic with the reason.
"""
