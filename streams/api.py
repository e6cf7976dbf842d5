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
    GET /v1/clusters/{c}/events                        recent preemptions and configuration changes, newest first

Answers are JSON; an unknown cluster, tenant or task is 404, a bad query 400, Redis down 503,
each with ``{"error": "..."}`` in one line.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources as package_files
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from fairstream.state.store import ViewReader
from fairstream.wire.visibility import (DEFAULT_PAGE_SIZE, DocumentError, cluster_summary, clusters_document,
                                        events_document, history_document, pending_by_tenant, pending_document,
                                        queues_document, tenants_document)

WEB_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/lines.js": ("lines.js", "text/javascript")}


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

    def events(self, cluster: str) -> dict[str, Any]:
        return events_document(cluster, self._status(cluster), self.reader.recent(cluster))

    def page_data(self, cluster: str | None) -> dict[str, Any]:
        """What the web page shows, for its first paint (``index.html``'s ``initial``): the
        clusters, and for ``cluster`` (else the first) its tenants, queues, pending (grouped,
        first page), history and events, from one read of its status and pending views.
        Errors are left to the page's own fetches."""
        clusters = self.clusters()
        names = [c["cluster"] for c in clusters["clusters"]]
        chosen = cluster if cluster in names else (names[0] if names else None)
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
                    events=events_document(chosen, status, self.reader.recent(chosen)))
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


def answer(visibility: Visibility, path: str, query: dict[str, list[str]]) -> tuple[int, dict]:
    """(HTTP status, JSON document) for a ``/v1`` GET."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    one = {k: v[-1] for k, v in query.items()}
    try:
        if parts == ["v1", "clusters"]:
            return 200, visibility.clusters()
        if len(parts) == 4 and parts[:2] == ["v1", "clusters"]:
            cluster, what = parts[2], parts[3]
            if what == "tenants":
                return 200, visibility.tenants(cluster)
            if what == "history":
                return 200, visibility.history(cluster)
            if what == "queues":
                return 200, visibility.queues(cluster)
            if what == "events":
                return 200, visibility.events(cluster)
            if what == "pending":
                try:
                    page, size = int(one.get("page", 1)), int(one.get("size", DEFAULT_PAGE_SIZE))
                except ValueError:
                    raise DocumentError("page and size must be whole numbers") from None
                group = one.get("group", "false")
                if group not in ("true", "false", "1", "0"):
                    raise DocumentError(f"group {group}: true or false")
                return 200, visibility.pending(cluster, one.get("tenant"), one.get("task"), page, size,
                                               one.get("reason"), group in ("true", "1"))
        return 404, {"error": f"{path}: no such resource (see /v1/clusters)"}
    except NotFound as exc:
        return 404, {"error": str(exc)}
    except DocumentError as exc:
        return 400, {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - Redis down or unreachable: say so, keep serving
        return 503, {"error": f"the state store cannot be read: {exc}"}


INITIAL = b'<script id="initial" type="application/json">null</script>'


def with_initial_data(page: bytes, visibility: Visibility, cluster: str | None) -> bytes:
    """``page`` with ``Visibility.page_data`` in its ``initial`` script element (JSON with
    ``<`` escaped, so no value can end the element); unchanged if the store cannot be read."""
    try:
        data = json.dumps(visibility.page_data(cluster)).replace("<", "\\u003c")
    except Exception:  # noqa: BLE001 - Redis down: the page loads and its fetches say why
        return page
    return page.replace(INITIAL, b'<script id="initial" type="application/json">' + data.encode() + b"</script>")


def serve_http(registry, redis_url: str, prefix: str, port: int, address: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Start the endpoint on ``address:port`` in a daemon thread (``OSError`` if the port is
    taken); returns the server (``shutdown()`` stops it)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from fairstream.state.store import redis_client

    visibility = Visibility(ViewReader(redis_client(redis_url, sync=True), prefix))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            url = urlparse(self.path)
            if url.path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif url.path in WEB_FILES:
                name, kind = WEB_FILES[url.path]
                body = package_files.files("fairstream.streams").joinpath("web", name).read_bytes()
                if name == "index.html":  # the first paint has data: the documents ride in the page
                    body = with_initial_data(body, visibility, parse_qs(url.query).get("cluster", [None])[-1])
                self._send(200, kind, body)
            else:
                status, document = answer(visibility, url.path, parse_qs(url.query))
                self._send(status, "application/json", json.dumps(document).encode())

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the worker logs with structlog
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="fairstream-http", daemon=True).start()
    return server


__all__ = ["Visibility", "answer", "serve_http", "NotFound"]
