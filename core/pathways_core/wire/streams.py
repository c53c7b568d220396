"""Stream plumbing shared by every gRPC peer: message size limits and batching."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

MAX_MESSAGE_BYTES = 64 << 20
MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
MAX_BATCH = 512


def batches(pending: queue.Queue, wrap: Callable[[list[Any]], Any]) -> Iterator[Any]:
    """Messages for a stream: each waits for one item, then takes whatever else is queued
    (up to ``MAX_BATCH``) so a burst of work crosses the wire in one message. ``None`` ends
    the stream."""
    while (first := pending.get()) is not None:
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
            if item is None:
                pending.put(None)
                break
            batch.append(item)
        yield wrap(batch)
