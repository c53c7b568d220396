"""``python -m pathways_operator.uninstall``: the chart's uninstall hooks.

Before (pre-delete): ``helm uninstall`` deleted a release's Islands and its operator at once:
the operator went before its finalizers had removed the islands' schedulers and executors, so
the Islands stayed ``Terminating`` for ever (and a later install of the release failed on their
names). Run before anything of the release is deleted, this deletes the release's Islands
(those its label selector matches), while the operator still runs, and waits until they are
gone.

After (post-delete, ``--finalizers``): programs and VirtualSlices are the tenants' and stay (a
slice bound to a deleted island is preempted, reason ``IslandDeleted``, and waits for devices;
an operator installed again takes them up), but each kept the operator's finalizer: deleted
later, one waited for an operator that was gone, and so did its namespace's deletion, for
ever. Once the release's operator pods are gone, this takes the finalizer off them (nothing
is lost: their children are owned by them, and an operator installed again puts it back).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from pathways_core.control.common import FINALIZER
from pathways_operator.kube import ApiError, Kube, credentials

ISLAND = ("pathways.dev/v1alpha1", "Island")
HELD = (("pathways.dev/v1alpha1", "PathwaysProgram"), ("pathways.dev/v1alpha1", "VirtualSlice"))
"""The kinds whose objects keep the operator's finalizer after it is uninstalled."""

POLL_SECONDS = 1.0

USER_AGENT = "pathways-uninstall"


async def delete_islands(
    kube: Kube,
    selector: str,
    timeout: float,
    say: Callable[[str], None] = print,
    poll: float = POLL_SECONDS,
) -> list[str]:
    """Delete the Islands ``selector`` matches and wait up to ``timeout`` seconds for them to
    be gone; the names of those still there then (none: all gone)."""
    islands = await kube.list(*ISLAND, label_selector=selector)
    names = sorted(island["metadata"]["name"] for island in islands)
    if not names:
        say(f"no islands match {selector!r}: nothing to delete")
        return []
    say(f"deleting {len(names)} islands: {', '.join(names)}")
    for name in names:
        await kube.delete(*ISLAND, None, name)
    deadline = time.monotonic() + timeout
    while True:
        remaining = sorted(
            island["metadata"]["name"]
            for island in await kube.list(*ISLAND, label_selector=selector)
            if island["metadata"]["name"] in names
        )
        if not remaining or time.monotonic() >= deadline:
            break
        await asyncio.sleep(poll)
    if remaining:
        say(
            f"still there after {timeout:g} s: {', '.join(remaining)}. The operator removes "
            "an island's pods before the island goes: check that it runs ('kubectl get pods "
            "-l app.kubernetes.io/component=operator' in the release's namespace, and its "
            "logs); if it is gone for good, 'kubectl patch island NAME --type=merge -p "
            '\'{"metadata":{"finalizers":null}}\'\' lets an island go without it (delete its '
            "scheduler Deployment and executor StatefulSet yourself then)"
        )
    else:
        say(f"deleted {len(names)} islands")
    return remaining


async def release_finalizers(
    kube: Kube,
    operator_selector: str,
    namespace: str,
    timeout: float,
    say: Callable[[str], None] = print,
    poll: float = POLL_SECONDS,
) -> bool:
    """Wait up to ``timeout`` seconds for the operator's pods (``operator_selector`` in
    ``namespace``) to be gone, then take the operator's finalizer off every PathwaysProgram
    and VirtualSlice; ``False`` (nothing taken off) if its pods are still there."""
    deadline = time.monotonic() + timeout
    while pods := await kube.list("v1", "Pod", namespace, label_selector=operator_selector):
        if time.monotonic() >= deadline:
            names = ", ".join(sorted(pod["metadata"]["name"] for pod in pods))
            say(
                f"the operator's pods are still there after {timeout:g} s ({names}): its "
                "finalizers stay on programs and virtual slices (it would put them back)"
            )
            return False
        await asyncio.sleep(poll)
    for api_version, kind in HELD:
        released = 0
        for document in await kube.list(api_version, kind):
            if await _release(kube, document):
                released += 1
        say(f"took the operator's finalizer off {released} {kind}s")
    return True


async def _release(kube: Kube, document: dict[str, Any]) -> bool:
    """Take the operator's finalizer off ``document`` (on the version read: one changed since
    is read again); whether it had it."""
    for _ in range(5):
        meta = document["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return False
        operations = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(FINALIZER)}"},
        ]
        api_version, kind = document["apiVersion"], document["kind"]
        try:
            await kube.patch(
                api_version, kind, meta.get("namespace"), meta["name"], operations, json_patch=True
            )
            return True
        except ApiError as error:
            if error.status == 404:
                return False
            if error.status not in (409, 422):
                raise
        found = await kube.get(api_version, kind, meta.get("namespace"), meta["name"])
        if found is None:
            return False
        document = {"apiVersion": api_version, "kind": kind, **found}
    return False


async def _run(work: Callable[[Kube], Awaitable[bool]], failed: str) -> int:
    """Exit status of ``work`` (done: 0) with a client of the cluster; an API error is said
    after ``failed``."""
    kube = Kube(
        lambda: credentials(kopf.OperatorSettings(), logging.getLogger(__name__)),
        user_agent=USER_AGENT,
    )
    try:
        done = await work(kube)
    except (ApiError, kopf.LoginError) as error:
        print(f"{failed}: {error}", file=sys.stderr)
        return 1
    finally:
        await kube.close()
    return 0 if done else 1


def main(argv: list[str] | None = None) -> int:
    """Delete the release's islands; exit 1 if some are still there after ``--timeout``. With
    ``--finalizers``: take the operator's finalizer off programs and slices once the release's
    operator pods (``--selector`` in ``--namespace``) are gone; exit 1 if they stay."""
    parser = argparse.ArgumentParser(
        prog="python -m pathways_operator.uninstall",
        description="Delete a release's Islands while its operator runs, and wait for them; "
        "with --finalizers, once its operator is gone, take its finalizer off programs and "
        "virtual slices.",
    )
    parser.add_argument(
        "--selector",
        required=True,
        help="label selector of the release's Islands (app.kubernetes.io/instance=RELEASE); "
        "with --finalizers, of its operator's pods",
    )
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds to wait for them (default 240)"
    )
    parser.add_argument(
        "--finalizers",
        action="store_true",
        help="after the release is deleted: release the finalizers its operator left",
    )
    parser.add_argument("--namespace", help="with --finalizers: the release's namespace")
    arguments = parser.parse_args(argv)
    if arguments.timeout <= 0:
        parser.error(f"--timeout: expected seconds above 0, got {arguments.timeout:g}")
    selector, timeout = arguments.selector, arguments.timeout
    if arguments.finalizers:
        if not arguments.namespace:
            parser.error("--finalizers: give --namespace, where the operator's pods ran")

        async def release(kube: Kube) -> bool:
            return await release_finalizers(kube, selector, arguments.namespace, timeout)

        return asyncio.run(_run(release, "could not take the operator's finalizers off"))

    async def delete(kube: Kube) -> bool:
        return not await delete_islands(kube, selector, timeout)

    return asyncio.run(_run(delete, "could not delete the islands"))


if __name__ == "__main__":
    sys.exit(main())
