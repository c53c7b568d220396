"""Session credentials: signed grants checked with the island's key, and what the dispatcher
and the queue hold a session to (its devices; its tenant's share of the queue bound)."""

from __future__ import annotations

import json

import pytest
from test_dispatcher import ARTIFACT, FUNCTION, client_events, computation, island
from test_program_dispatch import call, chain

from pathways_core.control.programs import RUN_CREDENTIAL_SECONDS, run_grants
from pathways_core.control.tenants import Tenants
from pathways_core.scheduling.queue import IslandQueue, QueueFull
from pathways_core.wire import pb
from pathways_core.wire.credentials import (
    CredentialError,
    SessionGrant,
    check_key,
    credentials_problem,
    sign,
    verify,
)

KEY = b"k" * 32
NOW = 1_800_000_000
Event = pb.ClientEvent


def grant(**change) -> SessionGrant:
    fields = {
        "island": "isl",
        "client": "team-a.train",
        "tenant": "team-a",
        "weight": 4,
        "priority": 10,
        "devices": frozenset({0, 1}),
        "expires": NOW + 60,
    }
    return SessionGrant(**{**fields, **change})


def test_a_signed_grant_is_read_back_as_it_was() -> None:
    for made in (grant(), grant(devices=None)):
        assert verify(sign(made, KEY), KEY, "isl", NOW) == made


@pytest.mark.parametrize(
    ("credential", "island", "now", "expected"),
    [
        (sign(grant(), b"x" * 32), "isl", NOW, "not signed by island 'isl'"),
        (sign(grant(), KEY), "other", NOW, "for island 'isl', not 'other'"),
        (sign(grant(), KEY), "isl", NOW + 61, "expired 1 s ago"),
        ("token", "isl", NOW, "is not one"),
        ("v1.e30.!!!", "isl", NOW, "not signed"),
        ("v2." + sign(grant(), KEY)[3:], "isl", NOW, "is not one"),
        ("v1." + "A" * 70_000, "isl", NOW, "at most"),
    ],
)
def test_a_credential_not_ours_is_refused_saying_why(credential, island, now, expected) -> None:
    with pytest.raises(CredentialError, match=expected):
        verify(credential, KEY, island, now)


def test_a_payload_changed_after_signing_is_refused() -> None:
    version, _payload, signature = sign(grant(), KEY).split(".")
    richer = sign(grant(weight=1000), KEY).split(".")[1]
    with pytest.raises(CredentialError, match="not signed"):
        verify(f"{version}.{richer}.{signature}", KEY, "isl", NOW)


def test_a_signed_grant_of_the_wrong_types_is_refused() -> None:
    with pytest.raises(CredentialError, match="malformed"):
        verify(sign(grant(weight=True), KEY), KEY, "isl", NOW)  # type: ignore[arg-type]


def test_a_hello_is_held_to_its_grant() -> None:
    made = grant()
    assert made.problem("team-a.train", 4, 10) is None
    assert made.problem("team-a.train", 1, -5) is None
    assert "is not the client 'team-a.train'" in str(made.problem("team-b.x", 1, 0))
    assert made.problem("team-a.train+proxy-ab12cd-1", 1, 0) is None  # the program's own
    assert "is not the client" in str(made.problem("team-a.trainer", 1, 0))
    assert "hello.weight 5 is above the 4" in str(made.problem("team-a.train", 5, 0))
    assert "hello.priority 11 is above the 10" in str(made.problem("team-a.train", 1, 11))


def test_keys_too_short_and_malformed_credentials_settings_are_named() -> None:
    with pytest.raises(ValueError, match="PATHWAYS_SESSION_KEY must be at least 32"):
        check_key("short")
    assert check_key("s" * 32) == b"s" * 32
    assert "is not JSON" in str(credentials_problem("{"))
    assert "must map island names" in str(credentials_problem('{"isl": 3}'))
    assert credentials_problem('{"isl": "v1.a.b"}') is None


def test_work_on_devices_the_grant_lacks_is_refused_and_the_rest_runs() -> None:
    dispatcher = island()
    dispatcher.connect("a", tenant="team-a", devices=frozenset({0, 1}))
    (refused,) = client_events(dispatcher.submit("a", computation("a", 1, devices=(1, 2))))
    assert refused.kind == Event.REJECTED
    assert "names devices [2] this session's credential does not grant" in refused.message
    assert not client_events(dispatcher.submit("a", computation("a", 2, devices=(0, 1))))
    # A hello with a new grant (a slice bound since) lets it use those too.
    dispatcher.connect("a", devices=frozenset({0, 1, 2}))
    assert not client_events(dispatcher.submit("a", computation("a", 3, devices=(2,))))
    # Sessions without a grant name any device.
    assert not client_events(dispatcher.submit("b", computation("b", 1, devices=(7,))))


def test_programs_and_calls_outside_the_grant_are_refused() -> None:
    dispatcher = island()
    program = chain([0, 5])
    (registered,) = client_events(dispatcher.register_program("b", program))
    assert registered.kind == Event.REGISTERED
    dispatcher.connect("a", devices=frozenset({0}))
    (refused,) = client_events(dispatcher.register_program("a", program))
    assert refused.kind == Event.REJECTED and "names devices [5]" in refused.message
    (refused,) = client_events(dispatcher.call("a", call(program.program_id, 1)))
    assert refused.kind == Event.REJECTED and "names devices [5]" in refused.message


def test_a_tenants_sessions_share_one_bound_on_the_queue() -> None:
    queue: IslandQueue[str] = IslandQueue(
        max_queued=100, max_queued_per_client=2, max_queued_per_tenant=3
    )
    for name in ("a1", "a2", "a3"):
        queue.add_client(name, tenant="team-a")
    queue.add_client("b")
    queue.submit("a1", "x")
    queue.submit("a1", "x")
    with pytest.raises(QueueFull, match="client 'a1' already queues 2 items, the per-client"):
        queue.submit("a1", "x")
    queue.submit("a2", "x")
    with pytest.raises(QueueFull, match="tenant 'team-a' already queue 3 items, the per-tenant"):
        queue.submit("a3", "x")
    for _ in range(2):
        queue.submit("b", "x")  # another's bound is its own
    queue.next()  # one of team-a's goes: room for one more
    queue.submit("a3", "y")
    queue.remove_client("a1")  # its items leave the tenant's count with it
    queue.submit("a3", "z")
    queue.remove_client("a2")
    queue.remove_client("a3")
    queue.add_client("a4", tenant="team-a")
    queue.submit("a4", "x")
    queue.submit("a4", "x")


def test_the_tenant_bound_is_half_the_queue_unless_set() -> None:
    assert IslandQueue(max_queued=4096, max_queued_per_client=1024).max_queued_per_tenant == 2048
    assert IslandQueue(max_queued=10, max_queued_per_client=8).max_queued_per_tenant == 8
    with pytest.raises(ValueError, match="max_queued_per_tenant must be >= 1"):
        IslandQueue(max_queued_per_tenant=0)


def test_the_busy_message_names_the_tenant() -> None:
    dispatcher = island(max_in_flight=1, max_queued=100, max_queued_per_tenant=1)
    dispatcher.submit("a", computation("a", 1))  # in flight: the rest wait in the queue
    for client in ("x", "y"):
        dispatcher.connect(client, tenant="team-x")
        registration = pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT)
        dispatcher.register(client, registration)
    assert not client_events(dispatcher.submit("x", computation("x", 1)))
    (busy,) = client_events(dispatcher.submit("y", computation("y", 1)))
    assert "the sessions of tenant 'team-x' already have 1 computations queued" in busy.message
    assert "max-queued-per-tenant 1" in busy.message


def test_a_runs_grant_is_held_to_the_tenant_policy() -> None:
    tenants = Tenants.from_wire({"team-b": {"maxPriority": 10}, "*": {"maxPriority": 0}})
    asked = grant(tenant="team-b", priority=1_000_000)
    assert (tenants.held_to(asked, "team-a").tenant, tenants.held_to(asked, "team-a").priority) == (
        "team-a",
        0,
    )
    assert tenants.held_to(asked, "team-b") == grant(tenant="team-b", priority=10)
    assert Tenants().held_to(asked, "team-b") == asked  # no policy: as asked


def test_a_signature_has_one_spelling() -> None:
    credential = sign(grant(), KEY)
    assert verify(credential, KEY, "isl", NOW) == grant()
    for respelled in (credential + "=", credential + "==", credential.replace("-", "+")):
        if respelled != credential:
            with pytest.raises(CredentialError, match="not signed"):
                verify(respelled, KEY, "isl", NOW)


def test_a_runs_grants_are_its_programs_on_its_slices_devices_per_island() -> None:
    slices = {
        "a": {"island": "one", "devices": [0, 1]},
        "b": {"island": "two", "devices": [4]},
        "c": {"island": "one", "devices": [3]},
    }
    environment = {
        "PATHWAYS_PROGRAM": "team-a/train",
        "PATHWAYS_TENANT": "team-a",
        "PATHWAYS_WEIGHT": "3",
        "PATHWAYS_PRIORITY": "5",
        "PATHWAYS_SLICES": json.dumps(slices),
    }
    one, two = run_grants(environment, NOW)
    assert one == SessionGrant(
        "one", "team-a.train", "team-a", 3, 5, frozenset({0, 1, 3}), NOW + RUN_CREDENTIAL_SECONDS
    )
    assert (two.island, two.devices) == ("two", frozenset({4}))
    assert run_grants({}, NOW) == []
    assert run_grants({**environment, "PATHWAYS_SLICES": "{"}, NOW) == []
