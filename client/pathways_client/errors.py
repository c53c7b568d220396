"""Errors the SDK raises: each says what went wrong and where, so the user can act on it."""

from __future__ import annotations


class PathwaysError(RuntimeError):
    """Base of the SDK's errors."""


class ConnectError(PathwaysError):
    """No cluster to connect to, or it did not answer."""


class SliceError(PathwaysError):
    """A virtual slice could not be bound; the message gives the reason."""


class NodeFailed(PathwaysError):
    """A computation failed: ``node`` names it, ``island`` where it ran, and the message carries
    the executor's explanation."""

    def __init__(self, node: str, island: str, message: str) -> None:
        # Another computation's failure (upstream, or earlier in the same program call) is
        # not this node's own: it did not run.
        other = message.startswith(("computation '", "buffer '")) and not message.startswith(
            f"computation {node!r}"
        )
        outcome = "did not run" if other else "failed"
        super().__init__(f"node {node!r} on island {island!r} {outcome}: {message}")
        self.node = node
        self.island = island


class DeletedError(PathwaysError):
    """A future was used after it was deleted."""
