"""An island's limits, shared by the scheduler (which enforces them), the executors (which check
again) and the SDK (which checks before sending).

- **Queued computations**: ``max_queued`` in all (default 4096), and at most
  ``max_queued_per_client`` of one client (default a quarter of ``max_queued``), so one client
  flooding the island leaves room for the others. Beyond either, the computation is refused at
  once with a message starting ``island busy:`` that names the island, the limit and says to
  retry later; nothing of it is kept, and the island keeps serving.
- **Clients' windows**: a client of the SDK keeps at most ``client_window`` computations
  outstanding on an island (:data:`SDK_WINDOW`, or the island's per-client bound if lower)
  and waits for completions beyond, so sixteen busy clients fit in the default queue without
  being told it is busy; the island dispatches only ``max_in_flight`` at a time, so a window
  of this size keeps it as busy as an unbounded one.
- **Client messages**: at most :data:`MAX_REQUEST_BYTES` each (artifacts aside): a program
  registration larger than that (thousands of nodes with long names) goes node by node.
- **Function artifacts**: at most ``max_artifact_bytes`` (default 32 MiB,
  ``PATHWAYS_MAX_ARTIFACT_BYTES``). A registration travels in one control frame, so the limit
  can be at most :data:`MAX_ARTIFACT_BYTES_CEILING` (the frame limit less room for the rest of
  the message).
"""

from __future__ import annotations

from collections.abc import Mapping

from pathways_core.wire.streams import MAX_MESSAGE_BYTES

DEFAULT_MAX_QUEUED = 4096
SDK_WINDOW = 256
DEFAULT_MAX_ARTIFACT_BYTES = 32 << 20
MAX_ARTIFACT_BYTES_CEILING = MAX_MESSAGE_BYTES - (1 << 20)
ARTIFACT_LIMIT_ENV = "PATHWAYS_MAX_ARTIFACT_BYTES"
BUSY_PREFIX = "island busy:"
# What one client message may hold (beyond, it is refused, naming the limit): what a client
# sends is echoed in commands to executors and events to clients, whose frames are capped.
MAX_REQUEST_BYTES = 1 << 20


def default_max_queued_per_client(max_queued: int) -> int:
    """A quarter of the island's queue (at least one computation)."""
    return max(1, max_queued // 4)


def client_window(max_queued_per_client: int) -> int:
    """Computations an SDK client keeps outstanding on an island whose per-client bound is
    ``max_queued_per_client`` (0: unknown, an island older than the field)."""
    return min(SDK_WINDOW, max_queued_per_client or SDK_WINDOW)


def is_busy(message: str) -> bool:
    """Whether a refusal says the island is busy (retrying later may succeed)."""
    return message.startswith(BUSY_PREFIX)


def busy_message(
    island: str, client: str, queued: int, limit: int, per_client: bool, tenant: str | None = None
) -> str:
    """Why a computation was refused for lack of room in the queue (``tenant``: the bound is
    shared by that tenant's clients)."""
    if per_client and tenant is not None:
        return (
            f"{BUSY_PREFIX} the sessions of tenant {tenant!r} already have {queued} computations "
            f"queued on island {island!r}, its limit per tenant (max-queued-per-tenant {limit}); "
            "retry later"
        )
    if per_client:
        return (
            f"{BUSY_PREFIX} client {client!r} already has {queued} computations queued on "
            f"island {island!r}, its limit per client (max-queued-per-client {limit}); "
            "retry later"
        )
    return (
        f"{BUSY_PREFIX} island {island!r} already queues {queued} computations, its limit "
        f"(max-queued {limit}); retry later"
    )


def check_artifact_limit(limit: int, setting: str = "max_artifact_bytes") -> int:
    """``limit`` if it is a usable artifact limit; ``ValueError`` naming ``setting``
    otherwise."""
    if not 1 <= limit <= MAX_ARTIFACT_BYTES_CEILING:
        raise ValueError(
            f"{setting} must be between 1 and {MAX_ARTIFACT_BYTES_CEILING} bytes (a registration "
            f"travels in one control frame of at most {MAX_MESSAGE_BYTES} bytes), not {limit}"
        )
    return limit


def artifact_limit_from(environment: Mapping[str, str]) -> int:
    """The artifact limit of ``PATHWAYS_MAX_ARTIFACT_BYTES`` in ``environment``, else the
    default; ``ValueError`` naming the variable when it is not a usable limit."""
    text = environment.get(ARTIFACT_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_ARTIFACT_BYTES
    try:
        limit = int(text)
    except ValueError:
        raise ValueError(f"{ARTIFACT_LIMIT_ENV} must be a number of bytes, not {text!r}") from None
    return check_artifact_limit(limit, ARTIFACT_LIMIT_ENV)


def artifact_problem(name: str, size: int, limit: int, where: str) -> str | None:
    """Why an artifact of ``size`` bytes may not be registered (``where`` says whose limit),
    or ``None``."""
    if size <= limit:
        return None
    return (
        f"function {name!r}: its artifact is {size} bytes, larger than {where} accepts "
        f"({limit} bytes, max-artifact-bytes / {ARTIFACT_LIMIT_ENV})"
    )
