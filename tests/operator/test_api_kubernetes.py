"""The REST API in kubernetes mode against the emulated API server: tokens checked with
TokenReview and SubjectAccessReview (tenant = the service account's namespace), programs and
slices stored as custom resources the operator's decisions see, quotas and idempotency."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterator
from typing import Any

import httpx
import kmock
import pytest
from kube_cluster import Cluster, wait_for

from pathways_api import kube_store
from pathways_api.app import create_app
from pathways_api.credentials import DerivedSessionKeys
from pathways_api.errors import RateLimited, Unauthorized, Unavailable
from pathways_api.kube_store import KubernetesStore, TokenReviewer
from pathways_api.service import Service
from pathways_core.wire.credentials import island_key, verify

# Token -> the identity the emulated TokenReview answers, and whether SubjectAccessReview allows.
IDENTITIES = {
    "token-a": ("system:serviceaccount:team-a:runner", True),
    "token-b": ("system:serviceaccount:team-b:runner", True),
    "token-readonly": ("system:serviceaccount:team-c:viewer", False),
    "token-human": ("alice@example.com", True),
}


def reviews(cluster: Cluster) -> None:
    """Answer TokenReviews and SubjectAccessReviews as a real API server would."""
    for group, plural, kind in (
        ("authentication.k8s.io/v1", "tokenreviews", "TokenReview"),
        ("authorization.k8s.io/v1", "subjectaccessreviews", "SubjectAccessReview"),
    ):
        cluster.emulator.resources[f"{group}/{plural}"] = kmock.ResourceInfo(
            kind=kind, namespaced=False, verbs={"create"}
        )

    async def answer(request: kmock.Request) -> None:
        plural = getattr(request.resource, "plural", None)
        if plural not in ("tokenreviews", "subjectaccessreviews"):
            return
        data = request.data
        data["metadata"] = {"generateName": "review-"}
        if plural == "tokenreviews":
            known = IDENTITIES.get(data["spec"]["token"])
            data["status"] = (
                {"authenticated": True, "user": {"username": known[0], "groups": []}}
                if known
                else {"authenticated": False}
            )
        else:
            user = data["spec"]["user"]
            allowed = any(name == user and ok for name, ok in IDENTITIES.values())
            attributes = data["spec"]["resourceAttributes"]
            allowed = allowed and attributes["namespace"] == user.split(":")[2]
            data["status"] = {"allowed": allowed}

    cluster.call_soon(lambda: cluster.emulator.hooks.append(answer))


class Api:
    """The app on one event loop (its store's connections belong to it), called in-process."""

    def __init__(self, app: Any, store: KubernetesStore) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api"
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture
def api(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    reviews(cluster)
    monkeypatch.setenv("PATHWAYS_API_QUOTA_PROGRAMS", "3")
    monkeypatch.setenv("PATHWAYS_API_QUOTA_PRIORITY", "100")  # the cluster's policy decides
    store = KubernetesStore.from_environment()
    running = Api(create_app(Service(store, "kubernetes"), TokenReviewer(store)), store)
    yield running
    running.loop.run_until_complete(store.http.aclose())
    running.close()


def call(api: Api, token: str | None, method: str, path: str, **arguments: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return api.loop.run_until_complete(
        api.client.request(
            method, path, headers={**headers, **arguments.pop("headers", {})}, **arguments
        )
    )


def program(name: str, devices: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "slices": [{"name": "main", "devices": devices}],
            "driver": {"source": "print(1)"},
        },
    }


def test_programs_become_custom_resources_of_the_tenants_namespace(
    cluster: Cluster, api: Api
) -> None:
    created = call(api, "token-a", "POST", "/v1/programs", json=program("train"))
    assert created.status_code == 201, created.text
    stored = cluster.get("PathwaysProgram", "train", "team-a")
    assert stored is not None and stored["spec"]["slices"][0]["devices"] == 2
    assert (
        call(api, "token-a", "GET", "/v1/programs/train").json()["metadata"]["uid"]
        == (stored["metadata"]["uid"])
    )
    # Tenant isolation: team-b sees nothing of team-a's.
    assert call(api, "token-b", "GET", "/v1/programs/train").status_code == 404
    assert call(api, "token-b", "GET", "/v1/programs").json()["items"] == []
    assert call(api, "token-b", "POST", "/v1/programs/train/cancel").status_code == 404
    assert call(api, "token-a", "GET", "/v1/me").json()["usage"] == {"devices": 2, "programs": 1}
    # Cancel suspends it for good.
    cancelled = call(api, "token-a", "POST", "/v1/programs/train/cancel")
    assert cancelled.status_code == 200, cancelled.text
    stored = cluster.get("PathwaysProgram", "train", "team-a")
    assert stored["spec"]["suspend"] is True
    assert stored["metadata"]["annotations"]["pathways.dev/cancelled"] == "true"
    assert call(api, "token-a", "GET", "/v1/me").json()["usage"]["programs"] == 0


def test_suspend_and_resume_patch_the_version_they_checked(
    cluster: Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert call(api, "token-a", "POST", "/v1/programs", json=program("train")).status_code == 201
    suspended = call(api, "token-a", "POST", "/v1/programs/train/suspend")
    assert suspended.status_code == 200, suspended.text
    assert cluster.get("PathwaysProgram", "train", "team-a")["spec"]["suspend"] is True
    assert call(api, "token-a", "GET", "/v1/me").json()["usage"]["programs"] == 1
    # Cancelled between the API's look and its patch: the patch of the version it checked is
    # refused, the program looked at again, and the resume refused, so nothing un-suspends a
    # cancelled program.
    real_get, raced = api.store.get, []

    async def get_then_cancel(kind: str, namespace: str | None, name: str) -> Any:
        document = await real_get(kind, namespace, name)
        if not raced:
            raced.append(name)
            cancel = {"metadata": {"annotations": {"pathways.dev/cancelled": "true"}}}
            cluster.patch("PathwaysProgram", name, cancel, namespace)
        return document

    monkeypatch.setattr(api.store, "get", get_then_cancel)
    resumed = call(api, "token-a", "POST", "/v1/programs/train/resume")
    assert resumed.status_code == 409, resumed.text
    assert "was cancelled, so it cannot resume" in resumed.json()["error"]["message"]
    assert raced == ["train"]
    assert cluster.get("PathwaysProgram", "train", "team-a")["spec"]["suspend"] is True


def test_quota_and_idempotency(cluster: Cluster, api: Api) -> None:
    key = {"Idempotency-Key": "once"}
    first = call(api, "token-a", "POST", "/v1/programs", json=program("p0"), headers=key)
    again = call(api, "token-a", "POST", "/v1/programs", json=program("p0"), headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["metadata"]["uid"] == first.json()["metadata"]["uid"]
    other = call(api, "token-a", "POST", "/v1/programs", json=program("p9", 1), headers=key)
    assert other.status_code == 409
    for name in ("p1", "p2"):
        assert call(api, "token-a", "POST", "/v1/programs", json=program(name)).status_code == 201
    refused = call(api, "token-a", "POST", "/v1/programs", json=program("p3"))
    assert refused.status_code == 429, refused.text
    assert len(cluster.list("PathwaysProgram", "team-a")) == 3
    # The key is the client's own value, kept on the object for replays: never shown (the
    # embedded store never shows it).
    for shown in (
        first.json(),
        again.json(),
        call(api, "token-a", "GET", "/v1/programs/p0").json(),
        *call(api, "token-a", "GET", "/v1/programs").json()["items"],
        call(api, "token-a", "POST", "/v1/programs/p0/suspend").json(),
    ):
        assert not (shown["metadata"].get("annotations") or {}).keys() & {
            kube_store.ANNOTATION_KEY,
            kube_store.ANNOTATION_FINGERPRINT,
        }, shown["metadata"]
    stored = cluster.get("PathwaysProgram", "p0", "team-a")["metadata"]["annotations"]
    assert stored[kube_store.ANNOTATION_KEY] == "once"


def _on(plural: str, method: str, answer: Any) -> Any:
    """An emulator hook running ``answer(request)`` on requests of ``method`` to ``plural``."""

    async def hook(request: kmock.Request) -> None:
        if getattr(request.resource, "plural", None) == plural and request.method == method:
            await answer(request)

    return hook


def test_an_admission_says_what_happened_to_its_create(
    cluster: Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed release of the Lease answered a stored create 429 (the caller's retry made a
    second program); a namespace's ResourceQuota refusal was a 503 outage; a release that
    failed held up the replica's next admission for the whole hold."""

    async def throttled(request: kmock.Request) -> None:
        if ((request.data or {}).get("spec") or {}).get("holderIdentity") == "":
            raise kmock.KubernetesError(429, "TooManyRequests", "slow down")

    release = _on("leases", "PATCH", throttled)
    cluster.call_soon(lambda: cluster.emulator.hooks.append(release))
    began = time.monotonic()
    for name in ("kept", "next"):  # the second takes the replica's own stale hold at once
        made = call(api, "token-a", "POST", "/v1/programs", json=program(name))
        assert made.status_code == 201, made.text
    assert time.monotonic() - began < 5
    assert cluster.get("Lease", "pathways-admission", "team-a")["spec"]["holderIdentity"]
    cluster.call_soon(lambda: cluster.emulator.hooks.remove(release))

    words = (
        'pathwaysprograms.pathways.dev "over" is forbidden: exceeded quota: tenant-quota, '
        "requested: count/pathwaysprograms.pathways.dev=1, used: 2, limited: 2"
    )

    async def quota(request: kmock.Request) -> None:
        raise kmock.KubernetesError(403, "Forbidden", words)

    refusing = _on("pathwaysprograms", "POST", quota)
    cluster.call_soon(lambda: cluster.emulator.hooks.append(refusing))
    over = call(api, "token-a", "POST", "/v1/programs", json=program("over"))
    cluster.call_soon(lambda: cluster.emulator.hooks.remove(refusing))
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "QuotaExceeded"
    assert words in over.json()["error"]["message"]


def test_a_create_is_never_sent_once_the_hold_may_end_before_it_is_stored(
    cluster: Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold lasted 10 s and a create the API server took 11 s over let another replica
    admit beside it: two programs over a quota of one. A hold now outlasts any create sent
    under it, and one not sent in time is not sent."""
    assert kube_store.LEASE_SECONDS > (
        kube_store.CREATE_BY_SECONDS + kube_store.APISERVER_REQUEST_SECONDS
    )
    monkeypatch.setattr(kube_store, "CREATE_BY_SECONDS", 0.5)

    async def slow(request: kmock.Request) -> None:
        await asyncio.sleep(1)

    listing = _on("pathwaysprograms", "GET", slow)
    cluster.call_soon(lambda: cluster.emulator.hooks.append(listing))
    late = call(api, "token-a", "POST", "/v1/programs", json=program("late"))
    cluster.call_soon(lambda: cluster.emulator.hooks.remove(listing))
    assert late.status_code == 503, late.text
    assert "nothing was created; try again" in late.json()["error"]["message"]
    assert cluster.list("PathwaysProgram", "team-a") == []


def test_replicas_admit_one_at_a_time_through_the_tenants_lease(
    cluster: Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two API replicas (the chart's default), each serialising only its own callers, both
    admitted a create that the quota left room for one of: 24 times in 25."""
    other_store = KubernetesStore.from_environment()
    other = httpx.AsyncClient(
        transport=httpx.ASGITransport(
            app=create_app(Service(other_store, "kubernetes"), TokenReviewer(other_store))
        ),
        base_url="http://api",
    )
    headers = {"Authorization": "Bearer token-a"}

    async def race(round: int) -> list[int]:
        answers = await asyncio.gather(
            *(
                client.post("/v1/programs", json=program(f"r{round}-{n}"), headers=headers)
                for n, client in enumerate((api.client, other, api.client, other))
            )
        )
        return [answer.status_code for answer in answers]

    try:
        for round in range(6):  # the quota is 3 programs: each round has room for three
            codes = api.loop.run_until_complete(race(round))
            assert sorted(codes) == [201, 201, 201, 429], codes
            assert len(cluster.list("PathwaysProgram", "team-a")) == 3
            for item in cluster.list("PathwaysProgram", "team-a"):
                cluster.delete("PathwaysProgram", item["metadata"]["name"], "team-a")
            wait_for(lambda: not cluster.list("PathwaysProgram", "team-a"), what="deleted")
        lease = cluster.get("Lease", "pathways-admission", "team-a")
        assert lease["spec"]["holderIdentity"] == ""  # let go after each admission
        # A replica that died holding it holds up the tenant's admissions until the hold
        # expires; one that keeps holding it has them answered 503, naming it.
        monkeypatch.setattr(kube_store, "ACQUIRE_SECONDS", 0.5)
        hold = {"holderIdentity": "dead-replica", "leaseDurationSeconds": 2}
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        held_until = time.monotonic() + 2
        cluster.patch(
            "Lease", "pathways-admission", {"spec": {**hold, "renewTime": stamp}}, "team-a"
        )
        held = call(api, "token-a", "POST", "/v1/programs", json=program("held"))
        assert held.status_code == 503, held.text
        assert "held by 'dead-replica'" in held.json()["error"]["message"]
        time.sleep(max(0.0, held_until - time.monotonic()) + 0.1)
        assert call(api, "token-a", "POST", "/v1/programs", json=program("free")).status_code == 201
    finally:
        api.loop.run_until_complete(other.aclose())
        api.loop.run_until_complete(other_store.http.aclose())


def test_made_up_tokens_are_reviewed_at_a_bounded_rate_and_evict_no_tenant(
    cluster: Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each made-up token cost a TokenReview, unlimited (no tenant, so no tenant's rate
    limit), and past 10,000 of them the whole cache went, every tenant's review with it."""
    monkeypatch.setattr(kube_store, "NEW_TOKEN_BURST", 5)
    monkeypatch.setattr(kube_store, "MAX_CACHED", 3)
    now = [0.0]
    reviewer = TokenReviewer(api.store, clock=lambda: now[0])
    run = api.loop.run_until_complete

    def reviews() -> int:
        return cluster.requests_to(lambda r: getattr(r.resource, "plural", None) == "tokenreviews")

    assert run(reviewer.authenticate("token-a")).name == "team-a"
    for n in range(4):
        with pytest.raises(Unauthorized):
            run(reviewer.authenticate(f"made-up-{n}"))
    asked = reviews()
    with pytest.raises(RateLimited, match="more new bearer tokens to check than 50 a second"):
        run(reviewer.authenticate("made-up-9"))
    assert run(reviewer.authenticate("token-a")).name == "team-a"  # kept, and not limited
    assert reviews() == asked  # neither asked the API server
    now[0] += 1.0  # the budget refills
    with pytest.raises(Unauthorized):
        run(reviewer.authenticate("made-up-9"))


def test_the_clusters_admission_policy_refusal_reaches_the_tenant_naming_the_field(
    cluster: Cluster, api: Api
) -> None:
    # As the chart's ValidatingAdmissionPolicy of the tenant policy answers a create.
    words = "spec.priority: 50 is above 10, the highest priority of tenant 'team-a'"

    async def admission(request: kmock.Request) -> None:
        data = request.data if isinstance(request.data, dict) else {}
        named = (data.get("metadata") or {}).get("name")
        if request.action == kmock.action.CREATE and named == "greedy":
            raise kmock.KubernetesError(
                403,
                "Forbidden",
                f'pathwaysprograms.pathways.dev "greedy" is forbidden: '
                f"ValidatingAdmissionPolicy 'pw-pathways-tenants' with binding "
                f"'pw-pathways-tenants' denied request: {words}",
            )

    cluster.call_soon(lambda: cluster.emulator.hooks.append(admission))
    greedy = {**program("greedy"), "spec": {**program("greedy")["spec"], "priority": 50}}
    refused = call(api, "token-a", "POST", "/v1/programs", json=greedy)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == {
        "code": "Forbidden",
        "message": f"refused by the cluster's admission policy: {words}",
        "field": "spec.priority",
    }
    assert cluster.list("PathwaysProgram", "team-a") == []
    assert call(api, "token-a", "POST", "/v1/programs", json=program("modest")).status_code == 201


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "missing bearer token"),
        ("nope", "TokenReview"),
        ("token-human", "service-account"),
        ("token-readonly", "SubjectAccessReview"),
    ],
)
def test_callers_the_cluster_does_not_vouch_for_are_401(
    cluster: Cluster, api: Api, token: str | None, message: str
) -> None:
    response = call(api, token, "POST", "/v1/programs", json=program("x"))
    assert response.status_code == 401
    assert message in response.json()["error"]["message"]
    assert cluster.list("PathwaysProgram") == []


def test_islands_virtual_slices_and_probes(cluster: Cluster, api: Api) -> None:
    cluster.create(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "Island",
            "metadata": {"name": "isl"},
            "spec": {"acceleratorKind": "cpu-fake", "topology": "4", "hosts": 1},
        }
    )
    islands = call(api, "token-b", "GET", "/v1/islands").json()["items"]
    assert [island["metadata"]["name"] for island in islands] == ["isl"]
    vs = {"metadata": {"name": "held"}, "spec": {"shape": "2x2"}}
    assert call(api, "token-b", "POST", "/v1/virtualslices", json=vs).status_code == 201
    assert call(api, "token-b", "GET", "/v1/me").json()["usage"]["devices"] == 4
    assert call(api, "token-b", "DELETE", "/v1/virtualslices/held").status_code == 200
    assert cluster.get("VirtualSlice", "held", "team-b") is None
    assert call(api, None, "GET", "/readyz").json() == {"status": "ok"}


def test_logs_are_the_pods_logs_by_run_through_a_window(cluster: Cluster, api: Api) -> None:
    assert call(api, "token-a", "POST", "/v1/programs", json=program("talker")).status_code == 201
    logs = {2: "three\n", 1: "one\ntwo\n"}  # listed out of order: answered by run
    for run in logs:
        labels = {"pathways.dev/program": "talker", "pathways.dev/run": str(run)}
        pod = f"talker-run-{run}-x"
        meta = {"name": pod, "namespace": "team-a", "labels": labels}
        cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta})
        cluster.emulator.pod_logs[("team-a", pod)] = logs[run].encode()
    other = {"pathways.dev/program": "another", "pathways.dev/run": "1"}
    meta = {"name": "another-run-1", "namespace": "team-a", "labels": other}
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta})
    cluster.emulator.pod_logs[("team-a", "another-run-1")] = b"not talker's\n"
    whole = call(api, "token-a", "GET", "/v1/programs/talker/logs").json()
    assert whole["logs"] == "--- run 1 ---\none\ntwo\n\n--- run 2 ---\nthree\n"
    tail = call(api, "token-a", "GET", "/v1/programs/talker/logs", params={"tailLines": 1})
    assert tail.json()["logs"] == "three\n"
    status = {"status": {"runs": 2}}
    cluster.patch("PathwaysProgram", "talker", status, namespace="team-a", sub="status")

    def pod_logs_read() -> int:
        return cluster.requests_to(lambda request: str(request.url.path).endswith("/log"))

    before = pod_logs_read()
    one = call(api, "token-a", "GET", "/v1/programs/talker/logs", params={"run": 1})
    assert one.json()["logs"] == "--- run 1 ---\none\ntwo\n"
    assert pod_logs_read() == before + 1  # only run 1's pod was asked for its log
    later = call(api, "token-a", "GET", "/v1/programs/talker/logs", params={"run": 3})
    assert later.status_code == 404 and "2 started so far" in later.text
    assert call(api, "token-b", "GET", "/v1/programs/talker/logs").status_code == 404

    # A kubelet failing to give a run's log is an error, not an empty log.
    async def failing_kubelet(request: kmock.Request) -> None:
        if str(request.url.path).endswith("talker-run-1-x/log"):
            raise kmock.KubernetesError(500, "InternalError", "kubelet unreachable")

    cluster.call_soon(lambda: cluster.emulator.hooks.append(failing_kubelet))
    failed = call(api, "token-a", "GET", "/v1/programs/talker/logs", params={"run": 1})
    assert failed.status_code == 503 and "could not be read" in failed.json()["error"]["message"]


def test_events_are_the_objects_own_not_those_of_an_earlier_one_of_its_name(
    cluster: Cluster, api: Api
) -> None:
    created = call(api, "token-a", "POST", "/v1/programs", json=program("again"))
    uid = created.json()["metadata"]["uid"]
    for name, event_uid, reason in (
        ("again", uid, "Running"),
        ("again", "uid-of-a-deleted-again", "JobFailed"),
        ("other", uid, "Elsewhere"),
    ):
        involved = {
            "kind": "PathwaysProgram",
            "name": name,
            "namespace": "team-a",
            "uid": event_uid,
        }
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.{reason.lower()}", "namespace": "team-a"},
                "involvedObject": involved,
                "type": "Normal",
                "reason": reason,
                "message": reason,
            }
        )
    answer = call(api, "token-a", "GET", "/v1/programs/again/events")
    assert answer.status_code == 200, answer.text
    assert [event["reason"] for event in answer.json()["items"]] == ["Running"]


def test_names_labels_and_the_api_servers_errors_reach_the_tenant_as_theirs(
    cluster: Cluster, api: Api
) -> None:
    # A name is one path segment: never a query, '..' or another namespace's path.
    for path in (
        "/v1/programs/%3FlabelSelector=x",
        "/v1/islands/%2E%2E",
        "/v1/programs/" + "a" * 300,
    ):
        assert call(api, "token-a", "GET", path).status_code == 404, path
    # A name still being deleted says so (it said "already exists", as embedded mode does not).
    held = {**program("going"), "apiVersion": "pathways.dev/v1alpha1", "kind": "PathwaysProgram"}
    held["metadata"] = {"name": "going", "namespace": "team-a", "finalizers": ["test/hold"]}
    cluster.create(held)
    cluster.delete("PathwaysProgram", "going", "team-a")
    again = call(api, "token-a", "POST", "/v1/programs", json=program("going"))
    assert again.status_code == 409
    assert "is still being deleted; submit it again once it is gone" in again.text
    cluster.patch("PathwaysProgram", "going", {"metadata": {"finalizers": None}}, "team-a")
    # The system's labels are the system's: a program's label freed a slice of the quota.
    labelled = {
        "metadata": {"name": "free", "labels": {"pathways.dev/program": "nope"}},
        "spec": {"devices": 4},
    }
    refused = call(api, "token-a", "POST", "/v1/virtualslices", json=labelled)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "metadata.labels.pathways.dev/program"
    # The API server's answers: its validation is the caller's (422), its throttling a wait
    # (429 with Retry-After), a missing namespace the cluster's (503, never 201 with nothing).
    answers = {
        "invalid": (422, "Invalid", "metadata.annotations: Too long"),
        "throttled": (429, "TooManyRequests", "slow down"),
        "homeless": (404, "NotFound", 'namespaces "team-a" not found'),
    }

    async def answer(request: kmock.Request) -> None:
        data = request.data if isinstance(request.data, dict) else {}
        named = (data.get("metadata") or {}).get("name")
        if request.action == kmock.action.CREATE and named in answers:
            raise kmock.KubernetesError(*answers[named])

    cluster.call_soon(lambda: cluster.emulator.hooks.append(answer))
    got = {
        name: call(api, "token-a", "POST", "/v1/programs", json=program(name)) for name in answers
    }
    assert got["invalid"].status_code == 422 and "Too long" in got["invalid"].text
    assert got["throttled"].status_code == 429 and got["throttled"].headers["Retry-After"]
    assert got["homeless"].status_code == 503 and "not found" in got["homeless"].text
    assert cluster.list("PathwaysProgram", "team-a") == []


def test_pages_move_on_from_the_last_item_given(cluster: Cluster, api: Api) -> None:
    # A token that was a position skipped an item when one before it was deleted, and gave
    # one twice when one was made before it.
    for name in ("d1", "d2", "d3", "d4"):
        one = {"metadata": {"name": name}, "spec": {"devices": 1}}
        assert call(api, "token-a", "POST", "/v1/virtualslices", json=one).status_code == 201
    first = call(api, "token-a", "GET", "/v1/virtualslices", params={"limit": 2}).json()
    assert [p["metadata"]["name"] for p in first["items"]] == ["d1", "d2"]
    assert call(api, "token-a", "DELETE", "/v1/virtualslices/d1").status_code == 200
    token = first["continue"]
    second = call(
        api, "token-a", "GET", "/v1/virtualslices", params={"limit": 2, "continue": token}
    )
    assert [p["metadata"]["name"] for p in second.json()["items"]] == ["d3", "d4"]
    bad = call(api, "token-a", "GET", "/v1/virtualslices", params={"continue": "c2VxOi0x"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "query continue"


def test_an_api_server_that_does_not_answer_is_named_with_what_happened() -> None:
    """A timeout said nothing: 'the Kubernetes API server did not answer: ' and no cause."""
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        store = KubernetesStore(f"http://127.0.0.1:{silent.getsockname()[1]}", None)
        store.http = httpx.AsyncClient(base_url=store.server, timeout=0.3)

        async def ask() -> None:
            try:
                await store.get("PathwaysProgram", "team-a", "p")
            finally:
                await store.http.aclose()

        with pytest.raises(Unavailable, match=r"did not answer: ReadTimeout \(after its timeout\)"):
            asyncio.run(ask())
    finally:
        silent.close()


def test_a_renewal_patches_the_annotation_on_the_version_it_checked(
    cluster: Cluster, api: Api
) -> None:
    leased = {"metadata": {"name": "leased"}, "spec": {"devices": 1, "leaseSeconds": 30}}
    assert call(api, "token-a", "POST", "/v1/virtualslices", json=leased).status_code == 201
    renewed = call(api, "token-a", "POST", "/v1/virtualslices/leased/renew")
    assert renewed.status_code == 200, renewed.text
    stored = cluster.get("VirtualSlice", "leased", "team-a")
    stamp = stored["metadata"]["annotations"]["pathways.dev/renewed-at"]
    assert renewed.json()["metadata"]["annotations"]["pathways.dev/renewed-at"] == stamp
    assert (stored["spec"]["leaseSeconds"], stored["metadata"]["generation"]) == (30, 1)
    assert call(api, "token-b", "POST", "/v1/virtualslices/leased/renew").status_code == 404
    # A holder names the slice it holds: another uid is a slice made since under its name,
    # neither renewed nor deleted (the API server checks the uid again as it deletes).
    uid = stored["metadata"]["uid"]
    for method, path in (("POST", "/renew"), ("DELETE", "")):
        other = call(api, "token-a", method, f"/v1/virtualslices/leased{path}?uid=not-{uid}")
        assert other.status_code == 404 and other.json()["error"]["field"] == "uid"
    assert (
        cluster.get("VirtualSlice", "leased", "team-a")["metadata"]["annotations"]
        == (stored["metadata"]["annotations"])
    )
    assert call(api, "token-a", "POST", f"/v1/virtualslices/leased/renew?uid={uid}").is_success
    # Released for its lease by the operator: never renewed again.
    cluster.patch(
        "VirtualSlice",
        "leased",
        {"status": {"phase": "Released", "reason": "LeaseExpired"}},
        "team-a",
        sub="status",
    )
    refused = call(api, "token-a", "POST", "/v1/virtualslices/leased/renew")
    assert refused.status_code == 409 and "ran out" in refused.json()["error"]["message"]
    unleased = {"metadata": {"name": "plain"}, "spec": {"devices": 1}}
    assert call(api, "token-a", "POST", "/v1/virtualslices", json=unleased).status_code == 201
    refused = call(api, "token-a", "POST", "/v1/virtualslices/plain/renew")
    assert refused.json()["error"]["field"] == "spec.leaseSeconds"
    deleted = call(api, "token-a", "DELETE", f"/v1/virtualslices/leased?uid={uid}")
    assert deleted.status_code == 200, deleted.text
    assert cluster.get("VirtualSlice", "leased", "team-a") is None


def test_session_credentials_are_signed_with_the_islands_derived_keys(
    cluster: Cluster, api: Api
) -> None:
    master = b"m" * 48
    keyed = Api(
        create_app(
            Service(api.store, "kubernetes", DerivedSessionKeys(master)), TokenReviewer(api.store)
        ),
        api.store,
    )
    keyed.loop.close()
    keyed.loop = api.loop  # the store's connections belong to one loop
    made = cluster.create(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "Island",
            "metadata": {"name": "isl"},
            "spec": {"acceleratorKind": "cpu-fake", "topology": "4", "hosts": 1},
        }
    )
    vs = {"metadata": {"name": "held"}, "spec": {"devices": 2}}
    assert call(keyed, "token-b", "POST", "/v1/virtualslices", json=vs).status_code == 201
    bound = {"phase": "Bound", "island": "isl", "devices": [1, 2]}
    cluster.patch("VirtualSlice", "held", {"status": bound}, "team-b", sub="status")
    request = {"json": {"client": "team-b.mine"}}
    answer = call(keyed, "token-b", "POST", "/v1/islands/isl/credentials", **request).json()
    key = island_key(master, made["metadata"]["uid"]).encode()
    grant = verify(answer["credential"], key, "isl", time.time())
    assert (grant.client, grant.tenant, grant.priority) == ("team-b.mine", "team-b", 100)
    assert grant.devices == frozenset({1, 2}) and answer["devices"] == [1, 2]
    # Another tenant's slices grant it nothing; names are the tenant's own.
    other = call(
        keyed, "token-a", "POST", "/v1/islands/isl/credentials", json={"client": "team-a.x"}
    )
    assert verify(other.json()["credential"], key, "isl", time.time()).devices == frozenset()
    taken = call(keyed, "token-a", "POST", "/v1/islands/isl/credentials", **request)
    assert taken.status_code == 422 and taken.json()["error"]["field"] == "client"
    # Without the master key the API signs none: the island needs none.
    plain = call(api, "token-b", "POST", "/v1/islands/isl/credentials", **request)
    assert plain.json()["credential"] is None
    api.loop.run_until_complete(keyed.client.aclose())
