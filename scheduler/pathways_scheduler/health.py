"""A liveness endpoint: ``GET /healthz`` answers ``ok`` from a thread of this process; a
readiness endpoint, ``GET /readyz``, once the process publishes what it is ready when
(:func:`publish_readiness`: 200, else 503 saying why); and ``GET /metrics``, once the process
publishes them (:func:`publish_metrics`), its Prometheus metrics.

It answers while the process can run Python, so a stopped or wedged process (SIGSTOP, an
interpreter held for good) fails the probe: Kubernetes' liveness probe of the island's pods
and the embedded supervisor restart the island then. Plain HTTP on its own port, carrying
nothing secret (the metrics name clients, not their data): kubelet probes and Prometheus
cannot present the island's TLS client certificate. The executor and the scheduler each hold
a copy of this module, as of ``lifeline.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_metrics: list[Callable[[], bytes]] = []  # what renders the metrics, once published
_readiness: list[Callable[[], str]] = []  # why the process is not ready ("": it is)


def publish_metrics(render: Callable[[], bytes]) -> None:
    """Serve ``render()`` at ``/metrics`` from now on."""
    _metrics[:] = [render]


def publish_readiness(not_ready: Callable[[], str]) -> None:
    """Answer ``/readyz`` from now on: 200 when ``not_ready()`` is empty, else 503 with it."""
    _readiness[:] = [not_ready]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, content, body = 404, "text/plain", b"not found"
        path = self.path.split("?", 1)[0]  # a scrape may carry parameters
        if path == PATH:
            status, body = 200, b"ok"
        elif path == READY_PATH and _readiness:
            why = _readiness[0]()
            status, body = (503, why.encode()) if why else (200, b"ready")
        elif path == METRICS_PATH and _metrics:
            status, content, body = 200, METRICS_TYPE, _metrics[0]()
        self.send_response(status)
        self.send_header("Content-Type", content)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a probe every few seconds is not news


def serve_health(host: str, port: int) -> int:
    """Serve ``/healthz`` on ``host:port`` (0 picks a free port) from a daemon thread; return
    the port."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return int(server.server_address[1])
