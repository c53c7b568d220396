"""The binding loop: coalesced passes of :func:`pathways_core.control.plan_bindings` (through
``plan_bindings_shared``, which binds time-shared slices in groups, as the embedded mode does).

Handlers ask for a pass (``await binder.sync()``) whenever something that may change bindings
happens; requests that arrive while a pass runs are all answered by the next one, so a burst
of 500 new slices costs a few passes, not 500. Each pass reads every Island and VirtualSlice
from the API server (the store is the only state: nothing is remembered between passes, so a
restart, or a standby replica taking over, rebuilds the allocation from the stored bindings
before binding anything), decides, and writes each changed status with a JSON patch that
first tests the slice's resourceVersion: a slice changed since it was read is not
overwritten, and the pass is run again.

Passes run in tasks of the binder's own, which a caller's cancellation does not reach: kopf
cancels a handler whose object went or whose filter stopped matching, and a pass cut there
left its bindings, Events and devices-free figures half written, with no pass after it. Each
pass keeps the plan's next lease expiry, which :meth:`Binder.expiry_due` waits for (in a kopf
daemon: a replica paused for a peer runs no pass): no renewal needs a pass, and a lease
shortened, or held by a program, is timed as the pass decides it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Coroutine, Iterable
from datetime import datetime
from typing import Any

from pathways_core.control import BindingPlan, SliceChange, Stage
from pathways_core.control.common import now_utc, prune
from pathways_core.control.sharing import plan_bindings_shared
from pathways_operator import metrics
from pathways_operator.config import Config
from pathways_operator.kube import ApiError, Kube

GROUP_VERSION = "pathways.dev/v1alpha1"
MAX_PASSES = 20
CONCURRENT_WRITES = 16
# After a lease's expiry: the pass's own clock must see it run out.
LEASE_MARGIN_SECONDS = 0.05

logger = logging.getLogger(__name__)


async def _bounded(calls: Iterable[Awaitable[Any]]) -> list[Any]:
    """Await calls with at most CONCURRENT_WRITES in flight; results in order."""
    gate = asyncio.Semaphore(CONCURRENT_WRITES)

    async def one(call: Awaitable[Any]) -> Any:
        async with gate:
            return await call

    return await asyncio.gather(*(one(call) for call in calls))


class Binder:
    """Runs binding passes, one at a time."""

    def __init__(self, kube: Kube, config: Config) -> None:
        self.kube = kube
        self.config = config
        self._lock = asyncio.Lock()
        self._requested = 0
        self._covered = 0
        self._first_seen: dict[str, float] = {}
        self.last_plan: BindingPlan | None = None
        self._last_done = -math.inf  # when the last pass ended (monotonic)
        # No lease runs out sooner than its length after this: with no operator serving (a
        # failover), its expiry would not have been seen anyway.
        self._started = now_utc()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_expiry: datetime | None = None
        self._expiry_moved = asyncio.Event()

    async def sync(self, fresher_than: float | None = None) -> None:
        """Return once a pass that started after this call has completed; with
        ``fresher_than``, at once if one ended less than that many seconds ago (a periodic
        check needs a recent pass, not one of its own)."""
        if fresher_than is not None and time.monotonic() - self._last_done < fresher_than:
            return
        self._requested += 1
        await asyncio.shield(self._spawn(self._serve(self._requested)))

    async def expiry_due(self) -> None:
        """Return once the next lease expiry of the last plan has passed (at once if it has;
        never while no plan has one), following it as passes move it."""
        while True:
            moved, expiry = self._expiry_moved, self._next_expiry
            if expiry is None:
                await moved.wait()
                continue
            wait = (expiry - now_utc()).total_seconds() + LEASE_MARGIN_SECONDS
            if wait <= 0:
                return
            try:
                await asyncio.wait_for(moved.wait(), wait)
            except TimeoutError:
                return

    async def close(self) -> None:
        """Stop any pass still running (the operator stops)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)
        # Retrieved here: a caller cancelled meanwhile never awaits it (its error is logged by
        # the callers that do).
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    def _keep_expiry(self, expiry: datetime | None) -> None:
        """The plan's next lease expiry, waking the waits of :meth:`expiry_due` if it moved."""
        if expiry != self._next_expiry:
            self._next_expiry = expiry
            self._expiry_moved.set()
            self._expiry_moved = asyncio.Event()

    async def _serve(self, ticket: int) -> None:
        async with self._lock:
            if self._covered >= ticket:
                return
            for _ in range(MAX_PASSES):
                start = self._requested
                again = await self._pass()
                self._covered = start
                self._last_done = time.monotonic()
                if not again:
                    return
            logger.warning(
                "bindings still changing after %d passes; next event retries", MAX_PASSES
            )

    async def _pass(self) -> bool:
        """One pass; whether another is needed at once."""
        began = time.monotonic()
        metrics.BINDING_PASSES.inc()
        islands = await self.kube.list(GROUP_VERSION, "Island")
        slices = await self.kube.list(GROUP_VERSION, "VirtualSlice")
        # After the slices, so the pass sees the program of every slice it sees (listed
        # before, one created in between had its first inline slice bound alone).
        programs = await self.kube.list(GROUP_VERSION, "PathwaysProgram")
        seen = time.monotonic()
        current = {f"{d['metadata'].get('namespace')}/{d['metadata']['name']}" for d in slices}
        for key in set(self._first_seen) - current:
            del self._first_seen[key]
        for document in slices:
            meta = document["metadata"]
            key = f"{meta.get('namespace')}/{meta['name']}"
            if (document.get("status") or {}).get("phase") != "Bound":
                self._first_seen.setdefault(key, seen)
        plan = plan_bindings_shared(
            islands,
            slices,
            now_utc(),
            tenants=self.config.tenants,
            programs=programs,
            leases_since=self._started,
        )
        self.last_plan = plan
        self._keep_expiry(plan.next_expiry)
        again = plan.needs_another_pass
        ordered = plan.ordered()
        for stage in Stage:
            changes = [change for change in ordered if change.stage is stage]
            # Writes of one stage are independent of each other: send them together.
            stored = await _bounded(self._write(change) for change in changes)
            if not all(stored):
                again = True
                if stage is Stage.RELEASE:
                    break  # devices move only once their release is stored
        await _bounded(self._post(event) for event in plan.events)
        await self._publish_free(islands, plan)
        metrics.SLICES.labels("Bound").set(plan.bound)
        metrics.SLICES.labels("Pending").set(plan.waiting)
        metrics.BINDING_PASS_SECONDS.observe(time.monotonic() - began)
        return again

    async def _write(self, change: SliceChange) -> bool:
        """Store one slice's new status, unless the slice changed since it was read."""
        meta = change.document["metadata"]
        operations = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": meta.get("resourceVersion"),
            },
            {"op": "add", "path": "/status", "value": prune(change.status)},
        ]
        try:
            await self.kube.patch(
                GROUP_VERSION,
                "VirtualSlice",
                meta.get("namespace"),
                meta["name"],
                operations,
                subresource="status",
                json_patch=True,
            )
        except ApiError as error:
            # 422: changed since read; 404: deleted. Either way the next pass decides again.
            if error.status not in (404, 409, 422):
                raise
            return False
        if change.stage is Stage.BIND:
            first = self._first_seen.pop(change.key, None)
            if first is not None:
                metrics.TIME_TO_BIND.observe(time.monotonic() - first)
        return True

    async def _post(self, event: Any) -> None:
        try:
            await self.kube.post_event(event)
        except ApiError as error:  # an Event is worth no retry of the whole pass
            logger.warning("could not record event %s: %s", event.reason, error)

    async def _publish_free(self, islands: list[dict[str, Any]], plan: BindingPlan) -> None:
        """Write devicesFree/devicesTotal to each island whose figures changed."""
        for island in islands:
            name = island["metadata"]["name"]
            if name not in plan.devices_free:
                continue
            free, total = plan.devices_free[name], plan.devices_total[name]
            metrics.DEVICES_FREE.labels(name).set(free)
            metrics.DEVICES_TOTAL.labels(name).set(total)
            status = island.get("status") or {}
            if status.get("devicesFree") == free and status.get("devicesTotal") == total:
                continue
            try:
                await self.kube.patch(
                    GROUP_VERSION,
                    "Island",
                    None,
                    name,
                    {"status": {"devicesFree": free, "devicesTotal": total}},
                    subresource="status",
                )
            except ApiError as error:
                if error.status != 404:
                    raise
