"""Gang-scheduling policies: pure state machines that order an island's computations."""

from pathways_core.scheduling.island import (
    ExecutorSpec,
    Instruction,
    IslandDispatcher,
    ToClient,
    ToExecutor,
    TraceRecord,
)
from pathways_core.scheduling.queue import (
    ClientState,
    IslandQueue,
    Policy,
    QueueFull,
    UnknownClient,
)

__all__ = [
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
]
