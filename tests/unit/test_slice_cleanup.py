"""A slice request interrupted (Ctrl-C) is deleted even when the interruption left the API
client's connection pool broken: the slice would otherwise bind later and hold its devices
and quota for no one."""

from __future__ import annotations

from types import SimpleNamespace

from pathways_client.api_client import ApiCallError
from pathways_client.cluster import Cluster


class Api:
    """Deletions fail until the client reconnects (``broken``) or the slice is gone."""

    def __init__(self, broken: bool, gone: bool = False) -> None:
        self.broken, self.gone = broken, gone
        self.deleted: list[str] = []
        self.reconnects = 0

    def delete(self, collection: str, name: str, uid: str | None = None) -> dict:
        if self.gone:
            raise ApiCallError(404, "NotFound", f"no slice {name!r}", None)
        if self.broken:
            raise RuntimeError("the connection pool is in a bad state")
        self.deleted.append(name)
        return {}

    def reconnect(self) -> None:
        self.reconnects += 1
        self.broken = False


def test_a_broken_connection_is_replaced_and_the_slice_deleted() -> None:
    api = Api(broken=True)
    cluster = SimpleNamespace(api=api, _leases=None)
    assert Cluster._delete_slice(cluster, "waiter", None) is None  # type: ignore[arg-type]
    assert (api.deleted, api.reconnects) == (["waiter"], 1)


def test_a_slice_already_gone_is_left_alone() -> None:
    api = Api(broken=False, gone=True)
    cluster = SimpleNamespace(api=api, _leases=None)
    assert Cluster._delete_slice(cluster, "waiter", None) is None  # type: ignore[arg-type]
    assert (api.deleted, api.reconnects) == ([], 0)
