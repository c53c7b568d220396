"""What the operator keeps per object between reconciles goes with the object: a reconcile
lock lives while a reconcile holds or awaits it (a plain dict kept one per program ever
made, 100 more per 100-program cycle in a churn probe)."""

from __future__ import annotations

import asyncio
import gc
import logging

import kopf
import pytest

from pathways_operator import handlers


def test_a_reconcile_lock_lives_while_a_reconcile_holds_or_awaits_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATHWAYS_METRICS_PORT", "0")

    async def scenario() -> None:
        memo = kopf.Memo()
        settings = kopf.OperatorSettings()
        settings.peering.standalone = True
        await handlers.startup(settings=settings, memo=memo, logger=logging.getLogger())
        try:
            order: list[str] = []

            async def reconcile(name: str) -> None:
                async with handlers._lock(memo, "program/team/p"):
                    order.append(f"{name} in")
                    await asyncio.sleep(0.05)
                    order.append(f"{name} out")

            await asyncio.gather(reconcile("first"), reconcile("second"))
            assert order == ["first in", "first out", "second in", "second out"]  # one at a time
            gc.collect()
            assert "program/team/p" not in memo.locks
        finally:
            await handlers.cleanup(memo=memo)

    asyncio.run(scenario())
