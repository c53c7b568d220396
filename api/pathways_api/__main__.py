"""``python -m pathways_api --host 0.0.0.0 --port 8080``: the REST API server.

``PATHWAYS_API_MODE`` chooses the store: ``embedded`` (default; the SQLite file and tokens file
of ``--state DIR``) or ``kubernetes`` (custom resources; tokens checked with TokenReview).
With ``PATHWAYS_TLS_CERT`` and ``PATHWAYS_TLS_KEY`` set it serves HTTPS only
(``pathways_api.tls``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import uvicorn

from pathways_api.app import MAX_BODY_BYTES, create_app
from pathways_api.credentials import SESSION_KEYS_FILE, DerivedSessionKeys, SessionKeys
from pathways_api.lifeline import stop_when_stdin_closes
from pathways_api.ratelimit import RATE_LIMIT_ENV, READ_RATE_LIMIT_ENV, budgets_from
from pathways_api.tls import TlsConfigError, https_options
from pathways_core import flags
from pathways_core.control.rate_limit import Budgets
from pathways_core.wire.credentials import MASTER_KEY_ENV, check_key


def build(
    mode: str,
    state: Path | None,
    tokens: Path | None,
    max_body: int,
    rate_limits: Budgets | None = None,
):
    """The app of a mode; ``rate_limits`` default to the environment's (see
    :mod:`pathways_api.ratelimit`)."""
    from pathways_api.service import Service

    if rate_limits is None:
        try:
            rate_limits = budgets_from(os.environ)
        except ValueError as error:
            raise SystemExit(str(error)) from None

    if mode == "embedded":
        from pathways_api.auth import TokenFile
        from pathways_api.store import API_BUSY_TIMEOUT_SECONDS, SqliteStore

        if state is None:
            raise SystemExit("embedded mode needs --state DIR (or PATHWAYS_STATE)")
        state.mkdir(parents=True, exist_ok=True)
        store = SqliteStore(state / "pathways.db", busy_timeout=API_BUSY_TIMEOUT_SECONDS)
        return create_app(
            Service(store, "embedded", SessionKeys(state / SESSION_KEYS_FILE)),
            TokenFile(tokens or state / "tokens.yaml"),
            max_body=max_body,
            rate_limits=rate_limits,
        )
    if mode == "kubernetes":
        from pathways_api.kube_store import KubernetesStore, TokenReviewer

        try:
            store = KubernetesStore.from_environment()
        except ValueError as error:  # a setting that is not usable, named
            raise SystemExit(str(error)) from None
        master = os.environ.get(MASTER_KEY_ENV)
        try:
            keys = DerivedSessionKeys(check_key(master, MASTER_KEY_ENV)) if master else None
        except ValueError as error:
            raise SystemExit(str(error)) from None
        return create_app(
            Service(store, "kubernetes", keys),
            TokenReviewer(store),
            max_body=max_body,
            rate_limits=rate_limits,
        )
    raise SystemExit(f"PATHWAYS_API_MODE must be embedded or kubernetes, not {mode!r}")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(prog="python -m pathways_api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=flags.port, default=8080, help="0 picks a free port.")
    parser.add_argument("--state", type=Path, default=os.environ.get("PATHWAYS_STATE"))
    parser.add_argument("--tokens", type=Path, default=None, help="Tokens file (embedded).")
    parser.add_argument(
        "--max-body",
        type=int,
        default=os.environ.get("PATHWAYS_API_MAX_BODY", str(MAX_BODY_BYTES)),
        help="Largest request body in bytes.",
    )
    parser.add_argument(
        "--rate-limit",
        default=None,
        help="Each tenant's mutating requests: RATE[,BURST] per second, 0 for no limit "
        f"(default: ${RATE_LIMIT_ENV}, else 100,5000).",
    )
    parser.add_argument(
        "--read-rate-limit",
        default=None,
        help="Each tenant's reads: RATE[,BURST] per second, 0 for no limit "
        f"(default: ${READ_RATE_LIMIT_ENV}, else 1000,10000).",
    )
    parser.add_argument(
        "--exit-with-launcher",
        action="store_true",
        help="stop when standard input closes (the embedded supervisor holds its other end)",
    )
    arguments = parser.parse_args(argv)
    if arguments.max_body < 1:
        parser.error(
            f"--max-body (or PATHWAYS_API_MAX_BODY) must be >= 1, not {arguments.max_body}"
        )
    try:
        rate_limits = budgets_from(os.environ, arguments.rate_limit, arguments.read_rate_limit)
    except ValueError as error:
        parser.error(str(error))
    try:
        https = https_options(os.environ)  # HTTPS when PATHWAYS_TLS_CERT and _KEY are set
    except TlsConfigError as error:
        parser.error(str(error))
    mode = os.environ.get("PATHWAYS_API_MODE", "embedded")
    app = build(mode, arguments.state, arguments.tokens, arguments.max_body, rate_limits)
    # Bind first, so the port is known (and printed) before serving: callers may ask for 0.
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every response written in two parts waits ~40 ms for a delayed ACK.
    family = socket.AF_INET6 if ":" in arguments.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((arguments.host, arguments.port))
    listener.listen(2048)  # connections wait in the backlog until uvicorn serves
    print(json.dumps({"port": listener.getsockname()[1], "pid": os.getpid()}), flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, **https)
    if arguments.exit_with_launcher:
        stop_when_stdin_closes()
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    main()
