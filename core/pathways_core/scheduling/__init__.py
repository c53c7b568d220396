"""Gang-scheduling policies: pure state machines that order an island's computations."""

from pathways_core.scheduling.island import (
    ExecutorSpec,
    Instruction,
    IslandDispatcher,
    ToClient,
    ToExecutor,
    TraceRecord,
)
from pathways_core.scheduling.limits import (
    ARTIFACT_LIMIT_ENV,
    BUSY_PREFIX,
    DEFAULT_MAX_ARTIFACT_BYTES,
    DEFAULT_MAX_QUEUED,
    MAX_ARTIFACT_BYTES_CEILING,
    SDK_WINDOW,
    artifact_limit_from,
    artifact_problem,
    check_artifact_limit,
    client_window,
    default_max_queued_per_client,
    is_busy,
)
from pathways_core.scheduling.queue import (
    DEFAULT_RUN_LENGTH,
    ClientState,
    IslandQueue,
    Policy,
    QueueFull,
    UnknownClient,
)
from pathways_core.scheduling.trace import DEFAULT_TRACE_LIMIT

__all__ = [
    "ARTIFACT_LIMIT_ENV",
    "BUSY_PREFIX",
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_RUN_LENGTH",
    "DEFAULT_TRACE_LIMIT",
    "MAX_ARTIFACT_BYTES_CEILING",
    "SDK_WINDOW",
    "ClientState",
    "ExecutorSpec",
    "Instruction",
    "IslandDispatcher",
    "IslandQueue",
    "Policy",
    "QueueFull",
    "ToClient",
    "ToExecutor",
    "TraceRecord",
    "UnknownClient",
    "artifact_limit_from",
    "artifact_problem",
    "check_artifact_limit",
    "client_window",
    "default_max_queued_per_client",
    "is_busy",
]
