"""The wire format, in one place for the worker (``streams/``), the producers (``producers/``)
and the tools: event types (``fairstream.core.model``'s events), decoding and validation against
the JSON schemas in ``fairstream/schemas/`` (``events``), topic names (``topics``), and Kafka
connection and security settings (``kafka``). Importing it loads neither the engine, the
policies, Redis nor Faust."""
