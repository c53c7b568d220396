"""``python -m pathways_api --host 0.0.0.0 --port 8080``: the REST API server.

``PATHWAYS_API_MODE`` chooses the store: ``embedded`` (default; the SQLite file and tokens file
of ``--state DIR``) or ``kubernetes`` (custom resources; tokens checked with TokenReview).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import uvicorn

from pathways_api.app import MAX_BODY_BYTES, create_app


def build(mode: str, state: Path | None, tokens: Path | None, max_body: int):
    """The app of a mode."""
    from pathways_api.service import Service

    if mode == "embedded":
        from pathways_api.auth import TokenFile
        from pathways_api.store import SqliteStore

        if state is None:
            raise SystemExit("embedded mode needs --state DIR (or PATHWAYS_STATE)")
        state.mkdir(parents=True, exist_ok=True)
        store = SqliteStore(state / "pathways.db")
        return create_app(
            Service(store, "embedded"),
            TokenFile(tokens or state / "tokens.yaml"),
            max_body=max_body,
        )
    if mode == "kubernetes":
        from pathways_api.kube_store import KubernetesStore, TokenReviewer

        store = KubernetesStore.from_environment()
        return create_app(Service(store, "kubernetes"), TokenReviewer(store), max_body=max_body)
    raise SystemExit(f"PATHWAYS_API_MODE must be embedded or kubernetes, not {mode!r}")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(prog="python -m pathways_api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port.")
    parser.add_argument("--state", type=Path, default=os.environ.get("PATHWAYS_STATE"))
    parser.add_argument("--tokens", type=Path, default=None, help="Tokens file (embedded).")
    parser.add_argument(
        "--max-body",
        type=int,
        default=int(os.environ.get("PATHWAYS_API_MAX_BODY", MAX_BODY_BYTES)),
        help="Largest request body in bytes.",
    )
    arguments = parser.parse_args(argv)
    mode = os.environ.get("PATHWAYS_API_MODE", "embedded")
    app = build(mode, arguments.state, arguments.tokens, arguments.max_body)
    # Bind first, so the port is known (and printed) before serving: callers may ask for 0.
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every response written in two parts waits ~40 ms for a delayed ACK.
    family = socket.AF_INET6 if ":" in arguments.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((arguments.host, arguments.port))
    listener.listen(2048)  # connections wait in the backlog until uvicorn serves
    print(json.dumps({"port": listener.getsockname()[1], "pid": os.getpid()}), flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    main()
