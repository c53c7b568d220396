"""Session credentials: what a session with an island's scheduler may claim, signed.

A scheduler started with a session key (``PATHWAYS_SESSION_KEY``) opens a session only for a
hello carrying a credential that key signed, and holds the session to it: the client name it
names (so no one takes another's; ``<name>+<anything>`` too, for a program's several
sessions, such as a proxy's beside it), a weight and a priority no higher than it grants, the
devices of the island it may run on (every computation, program and call is checked), and its
tenant, whose sessions share one bound on the queue (so many sessions of made-up names fill
no more of it than one). The resource manager that binds a run's slices signs them (it holds
the key of each island it manages); a program never sees a key.

A credential is ``v1.<payload>.<signature>``: the payload is the grant as compact JSON in
base64url, the signature HMAC-SHA256 of ``v1.<payload>`` under the island's key, in base64url.
It is a bearer token, as a Kubernetes service account token is: it travels inside the session's
TLS stream, and only to the island it names.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass

SESSION_KEY_ENV = "PATHWAYS_SESSION_KEY"
"""A scheduler's setting: the key credentials of its island are signed with (unset: sessions
need none, and say what they like)."""
SESSION_CREDENTIALS_ENV = "PATHWAYS_SESSION_CREDENTIALS"
"""A program's setting: JSON mapping each island it may reach to its credential there."""
MASTER_KEY_ENV = "PATHWAYS_SESSION_MASTER_KEY"
"""The operator's and the API's setting in a cluster: the release's key each island's session
key is derived from (:func:`island_key`; unset: islands take sessions without credentials)."""
SESSION_KEYS_FILE = "session-keys.json"
"""Where an embedded cluster keeps its islands' keys (island -> key), in its state folder."""
MIN_KEY_CHARACTERS = 32
VERSION = "v1"
MAX_CREDENTIAL_CHARACTERS = 64 * 1024  # 4096 devices' numbers, with room


class CredentialError(ValueError):
    """A credential that is malformed, not signed by the island's key, for another island, or
    expired; the message says which."""


@dataclass(frozen=True)
class SessionGrant:
    """What one session may claim on one island."""

    island: str
    client: str
    tenant: str
    weight: int  # the highest weight its hello may ask for
    priority: int  # the highest priority
    devices: frozenset[int] | None  # the island devices its work may name; None: any
    expires: int  # Unix seconds: a hello after it is refused

    def problem(self, client: str, weight: int, priority: int) -> str | None:
        """Why a hello naming ``client`` at ``weight`` and ``priority`` goes beyond this grant,
        or None."""
        if client != self.client and not client.startswith(f"{self.client}+"):
            return (
                f"hello.client {client[:64]!r} is not the client {self.client!r} this session's "
                "credential names"
            )
        if weight > self.weight:
            return (
                f"hello.weight {weight} is above the {self.weight} this session's credential grants"
            )
        if priority > self.priority:
            return (
                f"hello.priority {priority} is above the {self.priority} this session's "
                "credential grants"
            )
        return None


def credential_needed(island: str) -> str:
    """Why a session without a credential is refused, and what to do instead."""
    return (
        f"island {island!r} opens sessions with a signed credential only, and this one has "
        "none: connect through the cluster's API (pw.connect(state=DIR) for an embedded "
        "cluster, pw.connect(URL, token=...) or pathways proxy --state/--api), or run as one "
        "of its programs: each gives the session its credential"
    )


def check_key(key: str, setting: str = SESSION_KEY_ENV) -> bytes:
    """``key`` as bytes to sign with; ``ValueError`` naming ``setting`` when it is too short to
    be secret."""
    if len(key) < MIN_KEY_CHARACTERS:
        raise ValueError(
            f"{setting} must be at least {MIN_KEY_CHARACTERS} characters of random text (such "
            f"as 'openssl rand -hex 32'), not {len(key)}"
        )
    return key.encode()


def sign(grant: SessionGrant, key: bytes) -> str:
    """The credential of ``grant`` under ``key``."""
    payload: dict[str, object] = {
        "island": grant.island,
        "client": grant.client,
        "tenant": grant.tenant,
        "weight": grant.weight,
        "priority": grant.priority,
        "expires": grant.expires,
    }
    if grant.devices is not None:
        payload["devices"] = sorted(grant.devices)
    text = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    signed = f"{VERSION}.{_encode(text)}"
    return f"{signed}.{_encode(_mac(key, signed))}"


def verify(credential: str, key: bytes, island: str, now: float) -> SessionGrant:
    """The grant ``credential`` carries, once it is shown to be signed by ``key``, for
    ``island`` and not expired at ``now`` (Unix seconds); ``CredentialError`` otherwise."""
    if len(credential) > MAX_CREDENTIAL_CHARACTERS:
        raise CredentialError(
            f"the session credential is {len(credential)} characters long; at most "
            f"{MAX_CREDENTIAL_CHARACTERS}"
        )
    version, _, rest = credential.partition(".")
    payload, _, signature = rest.partition(".")
    if version != VERSION or not payload or not signature:
        raise CredentialError(
            f"the session credential is not one ({VERSION}.<payload>.<signature>): ask the "
            "cluster's resource manager for one"
        )
    # Compared as text: one signature has one spelling (no padding, '-' and '_').
    expected = _encode(_mac(key, f"{version}.{payload}"))
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        raise CredentialError(
            f"the session credential is not signed by island {island!r}'s key (made for "
            "another cluster, or before the island's key changed): ask for a new one"
        )
    grant = _grant(_decode(payload))
    if grant.island != island:
        raise CredentialError(
            f"the session credential is for island {grant.island!r}, not {island!r}"
        )
    if grant.expires <= now:
        raise CredentialError(
            f"the session credential expired {now - grant.expires:.0f} s ago: ask for a new one"
        )
    return grant


def island_key(master: bytes, island_uid: str) -> str:
    """An island's session key in a cluster, derived from the release's master key and the
    Island's uid: the operator (which puts it in the island's Secret) and the API derive it
    alike, and neither reads a Secret for it; an Island made again under its name gets
    another."""
    return hmac.new(master, f"pathways-island-session/{island_uid}".encode(), "sha256").hexdigest()


def credentials_problem(value: str) -> str | None:
    """What is wrong with a ``PATHWAYS_SESSION_CREDENTIALS`` value (JSON mapping island names
    to credentials), if anything."""
    try:
        parsed = json.loads(value)
    except ValueError as error:
        return f"{SESSION_CREDENTIALS_ENV} is not JSON: {error}"
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
    ):
        return f"{SESSION_CREDENTIALS_ENV} must map island names to credentials (strings)"
    return None


def credentials_text(credentials: Mapping[str, str]) -> str:
    """The ``PATHWAYS_SESSION_CREDENTIALS`` value of ``credentials``."""
    return json.dumps(dict(sorted(credentials.items())), separators=(",", ":"))


def _mac(key: bytes, signed: str) -> bytes:
    return hmac.new(key, signed.encode(), hashlib.sha256).digest()


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise CredentialError("the session credential is not base64url") from None


def _grant(payload: bytes) -> SessionGrant:
    """The grant of a signed payload (signed by us: still checked, as keys outlive versions)."""
    try:
        fields = json.loads(payload)
        devices = fields.get("devices")
        grant = SessionGrant(
            island=fields["island"],
            client=fields["client"],
            tenant=fields["tenant"],
            weight=fields["weight"],
            priority=fields["priority"],
            devices=None if devices is None else frozenset(devices),
            expires=fields["expires"],
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CredentialError(f"the session credential's grant is malformed: {error}") from None
    texts = (grant.island, grant.client, grant.tenant)
    numbers = (grant.weight, grant.priority, grant.expires, *(grant.devices or ()))
    if not all(isinstance(t, str) and t for t in texts) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers
    ):
        raise CredentialError("the session credential's grant is malformed")
    return grant
