"""A liveness endpoint: ``GET /healthz`` answers ``ok`` from a thread of this process.

It answers while the process can run Python, so a stopped or wedged process (SIGSTOP, an
interpreter held for good) fails the probe: Kubernetes' liveness probe of the island's pods
and the embedded supervisor restart the island then. Plain HTTP on its own port, carrying
nothing: kubelet probes cannot present the island's TLS client certificate. The executor and
the scheduler each hold a copy of this module, as of ``lifeline.py``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/healthz"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == PATH
        body = b"ok" if found else b"not found"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain")
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
