"""Elastic training: survive the loss of a slice and continue on the rest.

In the spirit of pathways-utils' ``elastic_retry``: a function wrapped by
``Manager.elastic_retry`` is called again when a computation fails because devices went away
(an executor died). Before each retry the manager finds which of its slices lost devices and
drops them; the function reads ``manager.available`` and resumes from its own last checkpoint
(host state it saved, such as fetched parameters):

    manager = pw.elastic.Manager(cluster, slices)

    @manager.elastic_retry(max_retries=2)
    def train():
        replicas = manager.available          # the slices still alive
        params = checkpoint.latest            # resume where the last attempt stopped
        ...

Failures that are not a loss of devices (a bad input, a bug) are raised at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from pathways_client import tls
from pathways_client.cluster import Cluster
from pathways_client.errors import ConnectError, NodeFailed, PathwaysError
from pathways_client.rpc import stub
from pathways_client.slices import Slice
from pathways_core.wire import EXECUTOR, pb

T = TypeVar("T")
PROBE_TIMEOUT_SECONDS = 2.0


class SlicesLost(PathwaysError):
    """Every slice is gone, or the retries are used up; ``lost`` names the slices lost."""

    def __init__(self, message: str, lost: Sequence[Slice]) -> None:
        super().__init__(message)
        self.lost = list(lost)


class Manager:
    """Tracks which of a program's slices are still usable and retries work after losses."""

    def __init__(self, cluster: Cluster, slices: Sequence[Slice]) -> None:
        self.cluster = cluster
        self.slices = list(slices)
        self.lost: list[Slice] = []
        self.events: list[tuple[int, str, list[str]]] = []  # (attempt, error, slices lost)

    @property
    def available(self) -> list[Slice]:
        """The slices whose devices all still answer, in their original order."""
        return [item for item in self.slices if item not in self.lost]

    def find_lost(self) -> list[Slice]:
        """Probe the executors of every available slice; mark and return the newly lost."""
        dead: dict[str, set[int]] = {}
        for island in {item.island for item in self.available}:
            session = self.cluster.session(island)
            dead[island] = {
                executor.index
                for executor in session.info.executors
                if not _answers(executor.endpoint)
            }
        newly = [
            item
            for item in self.available
            if any(
                self.cluster.session(item.island).device_owner.get(device) in dead[item.island]
                for device in item.devices
            )
        ]
        self.lost.extend(newly)
        return newly

    def elastic_retry(
        self,
        max_retries: int = 3,
        on_elastic_event: Callable[[int, BaseException, list[Slice]], None] | None = None,
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Retry the wrapped function up to ``max_retries`` times after losses of devices.
        ``on_elastic_event(attempt, error, lost)`` is called before each retry."""

        def decorate(function: Callable[..., T]) -> Callable[..., T]:
            @functools.wraps(function)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                attempt = 0
                while True:
                    try:
                        return function(*args, **kwargs)
                    except (NodeFailed, ConnectError) as error:
                        lost = self.find_lost()
                        if not lost:
                            raise  # not a loss of devices: the user's to fix
                        attempt += 1
                        self.events.append((attempt, str(error), [s.name for s in lost]))
                        if attempt > max_retries or not self.available:
                            raise SlicesLost(
                                f"lost slices {[s.name for s in self.lost]} "
                                f"({len(self.available)} left) after {attempt - 1} retries: "
                                f"{error}",
                                self.lost,
                            ) from error
                        if on_elastic_event is not None:
                            on_elastic_event(attempt, error, lost)

            return wrapper

        return decorate


def _answers(endpoint: str) -> bool:
    channel = tls.channel(endpoint, [], tls.load())
    try:
        stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=PROBE_TIMEOUT_SECONDS)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()
