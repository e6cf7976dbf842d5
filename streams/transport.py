"""Faust's Kafka transport with one change: how long the broker may hold a fetch.

Faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no setting to change it.
aiokafka leaves a partition out of the next fetch while records it already fetched are still
being handed to the agents; if that fetch holds only quiet partitions (a topic's other
partitions, the heartbeats), the broker keeps it the full wait before the busy partition can be
fetched again. Under load this locks in: every input event then waits about 1.5 s, however idle
the worker (measured: a steady 1.6 s p99 from the tenth second of a 5,000 events/s run, with the
worker at 65 % of a core; docs/benchmarks.md). A short wait bounds that delay, at the price of
an empty fetch every ``fetch_max_wait`` seconds when nothing arrives.

The transport is installed through ``App.transport``'s public setter; the consumer's wait is
set on the aiokafka consumer before it starts (aiokafka reads it when it builds its fetcher).
"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = transport.fetch_max_wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self):
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    fetch_max_wait_ms = 1500  # Faust's own


def kafka_transport(app, fetch_max_wait: float) -> Transport:
    """A transport for ``app`` whose consumer lets the broker hold a fetch at most
    ``fetch_max_wait`` seconds."""
    transport = Transport(app.conf.broker_consumer, app)
    transport.fetch_max_wait_ms = max(1, int(round(fetch_max_wait * 1000)))
    return transport

