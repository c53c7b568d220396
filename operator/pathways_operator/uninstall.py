"""``python -m pathways_operator.uninstall``: the chart's pre-delete hook.

``helm uninstall`` deleted a release's Islands and its operator at once: the operator went
before its finalizers had removed the islands' schedulers and executors, so the Islands stayed
``Terminating`` for ever (and a later install of the release failed on their names). Run
before anything of the release is deleted, this deletes the release's Islands (those its
label selector matches), while the operator still runs, and waits until they are gone.

Programs and VirtualSlices are the tenants' and stay: a slice bound to a deleted island is
preempted (reason ``IslandDeleted``) and waits for devices; an operator installed again takes
them up.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable

import kopf

from pathways_operator.kube import ApiError, Kube, credentials

ISLAND = ("pathways.dev/v1alpha1", "Island")

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


async def _run(selector: str, timeout: float) -> int:
    kube = Kube(
        lambda: credentials(kopf.OperatorSettings(), logging.getLogger(__name__)),
        user_agent=USER_AGENT,
    )
    try:
        remaining = await delete_islands(kube, selector, timeout)
    except (ApiError, kopf.LoginError) as error:
        print(f"could not delete the islands: {error}", file=sys.stderr)
        return 1
    finally:
        await kube.close()
    return 1 if remaining else 0


def main(argv: list[str] | None = None) -> int:
    """Delete the release's islands; exit 1 if some are still there after ``--timeout``."""
    parser = argparse.ArgumentParser(
        prog="python -m pathways_operator.uninstall",
        description="Delete a release's Islands while its operator runs, and wait for them.",
    )
    parser.add_argument(
        "--selector",
        required=True,
        help="label selector of the release's Islands (app.kubernetes.io/instance=RELEASE)",
    )
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds to wait for them (default 240)"
    )
    arguments = parser.parse_args(argv)
    if arguments.timeout <= 0:
        parser.error(f"--timeout: expected seconds above 0, got {arguments.timeout:g}")
    return asyncio.run(_run(arguments.selector, arguments.timeout))


if __name__ == "__main__":
    sys.exit(main())
