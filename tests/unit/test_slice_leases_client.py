"""The SDK's side of slice leases: a slice whose lease this session cannot tell is held is
refused (its devices may be another slice's), a renewal refused for good marks it lost, one
refused for now does not, and a proxy session on such a slice answers UNAVAILABLE."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pathways_client.api_client import ApiCallError
from pathways_client.cluster import Cluster, LeaseKeeper
from pathways_client.errors import ConnectError, SliceError
from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.island import IslandSession
from pathways_client.slices import Slice


class Api:
    """Answers renewals with ``answers`` in turn (an exception is raised)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    def another(self) -> Api:
        return self

    def renew(self, name: str, uid: str | None = None) -> dict:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {}


def test_a_lease_not_renewed_for_its_length_is_overdue_and_a_renewal_makes_it_fresh() -> None:
    lost: list[tuple[str, str]] = []
    throttled = ApiCallError(429, "RateLimited", "slow down", None)
    keeper = LeaseKeeper(Api(throttled, {}), 5, lambda *given: lost.append(given))
    keeper._thread = object()  # type: ignore[assignment]  # renewed by hand here
    keeper.hold("s", time.monotonic() - 6)
    keeper.renew_all()  # throttled: tried again next round, nothing lost
    assert lost == []
    overdue = keeper.overdue("s")
    assert overdue is not None and "renewals failed: RateLimited: slow down" in overdue
    keeper.renew_all()
    assert keeper.overdue("s") is None


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (
            ApiCallError(409, "Conflict", "the lease of virtual slice 's' ran out and ...", None),
            True,
        ),
        (ApiCallError(404, "NotFound", "no virtual slice named 's'", None), True),
        (ApiCallError(409, "Conflict", "virtual slice 's' keeps changing; try again", None), False),
        (ApiCallError(0, "Unreachable", "http://api: connection refused", None), False),
    ],
)
def test_only_a_renewal_refused_for_good_loses_the_slice(error: ApiCallError, gone: bool) -> None:
    lost: list[tuple[str, str]] = []
    keeper = LeaseKeeper(Api(error), 60, lambda *given: lost.append(given))
    keeper._thread = object()  # type: ignore[assignment]
    keeper.hold("s", time.monotonic())
    keeper.renew_all()
    assert bool(lost) is gone


def test_a_proxy_session_on_a_slice_it_may_no_longer_hold_answers_unavailable() -> None:
    """The proxy computed on, for its clients, on devices the cluster had given another."""

    def refused() -> None:
        raise SliceError("slice 's' cannot be used: its lease was last renewed 61 s ago")

    session = IslandSession.__new__(IslandSession)
    session._island = object()  # type: ignore[assignment]
    session.slice = SimpleNamespace(cluster_or_fail=refused)
    with pytest.raises(ProxyError) as caught:
        session.island  # noqa: B018
    assert caught.value.code == "UNAVAILABLE" and "last renewed 61 s ago" in str(caught.value)


def test_a_slice_released_while_its_renewal_was_in_flight_is_not_lost() -> None:
    """A session closing deleted its slices under a renewal round, which then warned that the
    cluster had released them."""
    lost: list[tuple[str, str]] = []
    keeper = LeaseKeeper(Api(), 5, lambda *given: lost.append(given))
    keeper._thread = object()  # type: ignore[assignment]  # renewed by hand here
    keeper.hold("s", time.monotonic())

    def renew(name: str, uid: str | None = None) -> dict:
        keeper.drop(name)  # the session released it meanwhile
        raise ApiCallError(404, "NotFound", "no virtual slice named 's'", None)

    keeper._api.renew = renew  # type: ignore[method-assign]
    keeper.renew_all()
    assert lost == []


class Unreachable:
    """An API that answers no deletion."""

    def __init__(self) -> None:
        self.deletions = 0

    def delete(self, kind: str, name: str, uid: str | None = None) -> None:
        self.deletions += 1
        raise ApiCallError(0, "Unreachable", "http://api: timed out", None)

    def reconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_release_the_api_did_not_take_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """It returned as if the slice were gone, which held its devices until deleted."""
    api = Unreachable()
    held = {name: Slice(name, "a", (0,), (1,)) for name in ("s", "t")}
    cluster = Cluster({}, api=api, bound=held, lease_seconds=None)  # type: ignore[arg-type]
    with pytest.raises(
        SliceError,
        match=r"slice 's' could not be deleted \(Unreachable: .*\): "
        r"it holds its devices until it is deleted; delete it with `pathways "
        r"delete s --kind virtualslices`",
    ):
        held["s"].release()
    assert api.deletions == 2  # once more on a fresh connection
    # Closing the session tries every slice and says which it could not delete.
    cluster.close()
    assert "slice 't' could not be deleted" in caplog.text


class Binding:
    """An API that binds every slice on island ``a`` and records deletions."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def submit(self, document: dict) -> dict:
        return document

    def get(self, kind: str, name: str) -> dict:
        if kind == "islands":
            return {"status": {"schedulerEndpoint": "127.0.0.1:1"}}
        return {"status": {"phase": "Bound", "island": "a", "devices": [0]}}

    def delete(self, kind: str, name: str, uid: str | None = None) -> None:
        self.deleted.append(name)


def test_a_slice_bound_on_an_island_whose_session_ended_goes_at_once() -> None:
    """It was bound, holding devices and quota, and failed only at its first call."""
    api = Binding()
    cluster = Cluster({}, api=api, lease_seconds=None)  # type: ignore[arg-type]
    cluster._sessions["a"] = SimpleNamespace(ended="the scheduler restarted")  # type: ignore[assignment]
    with pytest.raises(
        ConnectError,
        match=r"bound on island 'a', whose session with this "
        r"connection ended \(the scheduler restarted\): connect again",
    ):
        cluster.slice(devices=1, name="late")
    assert api.deleted == ["late"]
