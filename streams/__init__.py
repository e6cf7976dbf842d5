"""fairstream.streams: the Faust worker (``fairstream worker``; docs/architecture.md).

A thin adapter: the Faust agents (``app``) hand batches of input to one pipeline
(``processor``) of named stages: decode (``decoding``), admit and step each cluster's engine
(``stepping``, ``stepper``, ``session``), persist to the store, publish (``publishing``, with the
journal of ``journal``); ``rebuild`` reads again from Kafka what a store that lost writes lacks.
Events that cannot be applied go to the dead-letter topic with the reason.
"""
