"""``python -m pathways_client.trace_dump --island NAME=HOST:PORT --client C``: an island
trace's records of some clients, as JSON on stdout (the embedded manager keeps them per run):
``{"records": [...], "incomplete": {island: why, ...}}`` (islands that had let go of some)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc

from pathways_client import tls
from pathways_client.rpc import MESSAGE_OPTIONS, stub
from pathways_core.wire import SCHEDULER, pb

LET_GO = "the island had let go of its oldest records (it keeps about 200,000 of all clients)"


def records_of(
    island: str, endpoint: str, clients: set[str], timeout: float = 20.0, since_ns: int = 0
) -> tuple[list[dict[str, Any]], bool]:
    """The records of ``clients`` (all clients when empty) in one island's trace, of
    computations that started at ``since_ns`` or later; and whether the island had let go of
    some of theirs that ended then or later (it keeps about 200,000 records in all)."""
    with tls.channel(endpoint, MESSAGE_OPTIONS, tls.load()) as channel:
        request = pb.TraceRequest(clients=sorted(clients), since_ns=since_ns)
        trace = stub(channel, SCHEDULER, "GetTrace")(request, timeout=timeout)
    records = [
        {
            "seq": record.seq,
            "client": record.client,
            "name": record.name,
            "devices": list(record.devices),
            "executor": record.executor,
            "start_ns": record.start_ns,
            "end_ns": record.end_ns,
            "ok": record.ok,
            "island": island,
        }
        for record in trace.records
        if (not clients or record.client in clients) and record.start_ns >= since_ns
    ]
    lost = any(
        until >= since_ns
        for client, until in trace.dropped_until_ns.items()
        if not clients or client in clients
    )
    return records, lost


def main(argv: list[str] | None = None) -> int:
    """Print the records as a JSON list; an island that does not answer is said in one line
    (exit status 1)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--island", action="append", default=[], help="NAME=HOST:PORT")
    parser.add_argument("--client", action="append", default=[], help="Client name to keep.")
    parser.add_argument("--timeout", type=float, default=20.0, help="Seconds per island.")
    parser.add_argument(
        "--since-ns", type=int, default=0, help="Keep computations started then or later."
    )
    arguments = parser.parse_args(argv)
    found: list[dict[str, Any]] = []
    incomplete: dict[str, str] = {}
    for item in arguments.island:
        name, _, endpoint = item.partition("=")
        try:
            records, lost = records_of(
                name, endpoint, set(arguments.client), arguments.timeout, arguments.since_ns
            )
        except grpc.RpcError as error:
            print(
                f"island {name!r} at {endpoint} gave no trace: {error.code().name}: "
                f"{error.details()}",
                file=sys.stderr,
            )
            return 1
        found += records
        if lost:
            incomplete[name] = LET_GO
    print(json.dumps({"records": found, "incomplete": incomplete}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
