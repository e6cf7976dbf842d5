"""Faust's Kafka transport with three changes: how long the broker may hold a fetch, how much
data it waits for, and a hook where the consumer has sought to Kafka's committed offsets.

Faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no setting to change it.
aiokafka leaves a partition out of the next fetch while records it already fetched are still
being handed to the agents; if that fetch holds only quiet partitions (a topic's other
partitions, the heartbeats), the broker keeps it the full wait before the busy partition can be
fetched again. Under load this locks in: every input event then waits about 1.5 s, however idle
the worker (measured: a steady 1.6 s p99 from the tenth second of a 5,000 events/s run, with the
worker at 65 % of a core; docs/benchmarks.md). A short wait bounds that delay, at the price of
an empty fetch every ``fetch_max_wait`` seconds when nothing arrives.

With the short wait and aiokafka's ``fetch_min_bytes=1`` the broker answers as soon as any
record arrives, so under load the consumer sends a fetch for every few records: at 5,000
events/s a quarter of the worker's samples were in the consumer and 8 % in sending fetch
requests. ``fetch_min_bytes`` (8 KiB by default) lets the broker gather a batch first; it never
holds a fetch longer than ``fetch_max_wait`` either way, so at low load an event waits at most
that much more (measured: worker CPU 92 % -> 61-76 % at 5,000 events/s, same p99;
docs/benchmarks.md).

The transport is installed through ``App.transport``'s public setter; both values are set on
the aiokafka consumer before it starts (aiokafka reads them when it builds its fetcher).

At start-up and after every rebalance Faust seeks each assigned partition to its committed
offset (``perform_seek``) before the agents get anything; ``on_seek`` is then told those
offsets (0 for a partition with none), so the worker can compare them, and its journal, with
its state store's and read again what a store that lost writes no longer has
(``Processor.consuming_from``, ``rebuild.read_again``).
"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = transport.fetch_max_wait_ms
        consumer._fetch_min_bytes = transport.fetch_min_bytes
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    on_seek = None  # called with {"topic:partition": committed offset} after perform_seek

    def _new_consumer_thread(self):
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        if self.on_seek is not None:
            assigned = self.assignment()
            committed = self._committed_offset
            self.on_seek({f"{tp.topic}:{tp.partition}": committed.get(tp) or 0 for tp in assigned})


class Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    fetch_max_wait_ms = 1500  # Faust's own
    fetch_min_bytes = 1  # aiokafka's own


def kafka_transport(app, fetch_max_wait: float, fetch_min_bytes: int) -> Transport:
    """A transport for ``app`` whose consumer lets the broker hold a fetch at most
    ``fetch_max_wait`` seconds, until it has ``fetch_min_bytes`` of records."""
    transport = Transport(app.conf.broker_consumer, app)
    transport.fetch_max_wait_ms = max(1, int(round(fetch_max_wait * 1000)))
    transport.fetch_min_bytes = max(1, int(fetch_min_bytes))
    return transport

