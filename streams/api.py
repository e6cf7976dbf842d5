"""The worker's read-only HTTP endpoint (``--metrics-port``): Prometheus metrics at
``/metrics``, the visibility API ``/v1/...`` and the web page at ``/``, all from what the
worker wrote to Redis (``fairstream.wire.visibility``), so a request never touches the engine
the worker is running. ``fairstream status`` and ``fairstream pending`` read the same
documents through ``Visibility``.

    GET /v1/clusters                                   clusters with their totals
    GET /v1/clusters/{c}/tenants                       every tenant's status, in the policy's order
    GET /v1/clusters/{c}/pending?tenant=T&page=N&size=M  pending entries and why they wait
    GET /v1/clusters/{c}/pending?task=ID               the entry holding one task, its position
    GET /v1/clusters/{c}/history                       per tenant share and usage, last hour
    GET /v1/clusters/{c}/queues                        the tenant tree: weights, limits, shares, what holds each
    GET /v1/clusters/{c}/events                        recent preemptions and configuration changes, newest first,
                                                       and per tenant its preemptions and work lost
    GET /v1/clusters/{c}/nodes                         its nodes: use, and the reservation each holds

Answers are JSON; an unknown cluster, tenant or task is 404, a bad query 400, Redis down 503,
each with ``{"error": "..."}`` in one line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from importlib import resources as package_files
from typing import Any

from aiohttp import web

from fairstream.state.store import ViewReader
from fairstream.wire.visibility import (
    DEFAULT_PAGE_SIZE,
    DocumentError,
    busiest_cluster,
    cluster_summary,
    clusters_document,
    events_document,
    history_document,
    nodes_document,
    pending_by_tenant,
    pending_document,
    queues_document,
    tenants_document,
)


class NotFound(DocumentError):
    """An unknown cluster, tenant or task (404)."""


class Visibility:
    """The ``v1`` documents from a ``ViewReader``."""

    def __init__(self, reader: ViewReader) -> None:
        self.reader = reader

    def _status(self, cluster: str) -> dict:
        status = self.reader.field(cluster, "explain", "status")
        if status is None:
            if cluster in self.reader.clusters():
                raise NotFound(f"cluster {cluster}: no explanation written yet (the worker writes one with its "
                               f"next commit)")
            raise NotFound(f"cluster {cluster}: unknown (known: {', '.join(self.reader.clusters()) or 'none'})")
        return status

    def clusters(self) -> dict[str, Any]:
        return clusters_document([cluster_summary(c, self.reader.field(c, "explain", "status"))
                                  for c in self.reader.clusters()])

    def tenants(self, cluster: str) -> dict[str, Any]:
        return tenants_document(cluster, self._status(cluster))

    def _all_pending(self, cluster: str) -> dict[str, dict]:
        names = [f for f in self.reader.fields(cluster, "explain") if f.startswith("pending:")]
        return pending_by_tenant({name: self.reader.field(cluster, "explain", name) for name in names})

    def queues(self, cluster: str) -> dict[str, Any]:
        return queues_document(cluster, self._status(cluster), self._all_pending(cluster))

    def nodes(self, cluster: str) -> dict[str, Any]:
        return nodes_document(cluster, self._status(cluster), self.reader.field(cluster, "explain", "nodes"))

    def events(self, cluster: str) -> dict[str, Any]:
        return events_document(cluster, self._status(cluster), self.reader.recent(cluster),
                               self.reader.preempted(cluster))

    def page_data(self, cluster: str | None) -> dict[str, Any]:
        """What the web page shows, for its first paint (``index.html``'s ``initial``): the
        clusters, and for ``cluster`` (else the busiest: ``busiest_cluster``) its tenants, queues, pending (grouped,
        first page), history and events, from one read of its status and pending views.
        Errors are left to the page's own fetches."""
        clusters = self.clusters()
        names = [c["cluster"] for c in clusters["clusters"]]
        chosen = cluster if cluster in names else busiest_cluster(clusters)
        data: dict[str, Any] = {"clusters": clusters, "cluster": chosen}
        if chosen is None:
            return data
        try:
            status = self._status(chosen)
        except NotFound:  # no explanation written yet
            return data
        pending = self._all_pending(chosen)
        data.update(tenants=tenants_document(chosen, status), queues=queues_document(chosen, status, pending),
                    pending=pending_document(chosen, status, pending, group=True),
                    history=history_document(chosen, status, self.reader.history(chosen)),
                    nodes=nodes_document(chosen, status, self.reader.field(chosen, "explain", "nodes")),
                    events=events_document(chosen, status, self.reader.recent(chosen),
                                           self.reader.preempted(chosen)))
        return data

    def pending(self, cluster: str, tenant: str | None = None, task: str | None = None, page: int = 1,
                size: int = DEFAULT_PAGE_SIZE, reason: str | None = None, group: bool = False) -> dict[str, Any]:
        status = self._status(cluster)
        if tenant is not None:  # one field: a tenant's page costs its own entries, not everyone's
            stored = self.reader.field(cluster, "explain", f"pending:{tenant}")
            pending = {} if stored is None else {tenant: stored}
        else:
            pending = self._all_pending(cluster)
        try:
            return pending_document(cluster, status, pending, tenant, task, page, size, reason, group)
        except DocumentError as exc:
            if str(exc).startswith(("tenant ", "task ")):
                raise NotFound(str(exc)) from None
            raise

    def history(self, cluster: str) -> dict[str, Any]:
        return history_document(cluster, self._status(cluster), self.reader.history(cluster))


INITIAL = b'<script id="initial" type="application/json">null</script>'


def with_initial_data(page: bytes, visibility: Visibility, cluster: str | None) -> bytes:
    """``page`` with ``Visibility.page_data`` in its ``initial`` script element (JSON with
    ``<`` escaped, so no value can end the element); unchanged if the store cannot be read."""
    try:
        data = json.dumps(visibility.page_data(cluster)).replace("<", "\\u003c")
    except Exception:  # Redis down: the page loads and its fetches say why
        return page
    return page.replace(INITIAL, b'<script id="initial" type="application/json">' + data.encode() + b"</script>")


def http_app(registry, visibility: Visibility) -> web.Application:
    """The endpoint as an aiohttp application: ``/metrics`` from ``registry``, the page, and
    the ``/v1`` documents of ``visibility``. Its reads of the store are blocking (a Redis
    client's), so each runs in a thread: a slow Redis never holds the worker's event loop."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    routes = web.RouteTableDef()

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        # In a thread too: a scrape of many tenants' gauges would hold the loop (the consumer
        # lag it reports only reads, ``streams.app.consumer_lag``).
        return _respond(200, CONTENT_TYPE_LATEST, await asyncio.to_thread(generate_latest, registry))

    @routes.get("/")
    async def page(request: web.Request) -> web.Response:
        body = package_files.files("fairstream.streams").joinpath("web", "index.html").read_bytes()
        # The first paint has data: the documents ride in the page.
        body = await asyncio.to_thread(with_initial_data, body, visibility, request.query.get("cluster"))
        return _respond(200, "text/html; charset=utf-8", body)

    @routes.get("/lines.js")
    async def lines(request: web.Request) -> web.Response:
        body = package_files.files("fairstream.streams").joinpath("web", "lines.js").read_bytes()
        return _respond(200, "text/javascript", body)

    @routes.get("/v1/clusters")
    async def clusters(request: web.Request) -> web.Response:
        return await _document(visibility.clusters)

    @routes.get("/v1/clusters/{cluster}/{what:tenants|history|queues|events|nodes}")
    async def of_cluster(request: web.Request) -> web.Response:
        return await _document(getattr(visibility, request.match_info["what"]), request.match_info["cluster"])

    @routes.get("/v1/clusters/{cluster}/pending")
    async def pending(request: web.Request) -> web.Response:
        # A key given twice: its last value; one given blank: as if not given.
        one = {key: value for key in request.query if (value := request.query.getall(key)[-1])}
        try:
            page, size = int(one.get("page", 1)), int(one.get("size", DEFAULT_PAGE_SIZE))
        except ValueError:
            return _error(400, "page and size must be whole numbers")
        group = one.get("group", "false")
        if group not in ("true", "false", "1", "0"):
            return _error(400, f"group {group}: true or false")
        return await _document(visibility.pending, request.match_info["cluster"], one.get("tenant"), one.get("task"),
                               page, size, one.get("reason"), group in ("true", "1"))

    @routes.route("*", "/{anything:.*}")
    async def elsewhere(request: web.Request) -> web.Response:
        return _error(404, f"{request.path}: no such resource (see /v1/clusters)")

    app = web.Application()
    app.add_routes(routes)
    return app


async def _document(read: Callable[..., dict], *args) -> web.Response:
    """``read(*args)`` in a thread, answered as JSON: 404 for what is unknown, 400 for a bad
    query, 503 when the store cannot be read, each ``{"error": "..."}`` in one line."""
    try:
        return _respond(200, "application/json", json.dumps(await asyncio.to_thread(read, *args)).encode())
    except NotFound as exc:
        return _error(404, str(exc))
    except DocumentError as exc:
        return _error(400, str(exc))
    except Exception as exc:  # Redis down or unreachable: say so, keep serving
        return _error(503, f"the state store cannot be read: {exc}")


def _error(status: int, message: str) -> web.Response:
    return _respond(status, "application/json", json.dumps({"error": message}).encode())


def _respond(status: int, kind: str, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, headers={"Content-Type": kind, "Cache-Control": "no-store"})


async def serve_http(registry, redis_url: str, prefix: str, port: int, address: str = "127.0.0.1") -> web.AppRunner:
    """Serve ``http_app`` on ``address:port`` on the running event loop (``OSError`` if the
    port is taken); returns its runner (``await runner.cleanup()`` stops it)."""
    from fairstream.state.store import redis_client

    runner = web.AppRunner(http_app(registry, Visibility(ViewReader(redis_client(redis_url, sync=True), prefix))),
                           access_log=None)  # quiet: the worker logs with structlog
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


__all__ = ["Visibility", "http_app", "serve_http", "NotFound"]
