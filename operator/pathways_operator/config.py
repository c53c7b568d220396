"""The operator's settings, from its environment (see the contracts and the README)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from pathways_core.control.programs import FAILURE_GRACE_SECONDS
from pathways_core.control.security import CONTROL_TOKENS_ENV, PULL_SECRETS_ENV, TLS_SECRET_ENV
from pathways_core.control.tenants import Tenants
from pathways_core.resources.island import DEFAULT_IMAGE
from pathways_core.wire.credentials import MASTER_KEY_ENV, check_key

TENANTS_ENV = "PATHWAYS_TENANTS"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class Config:
    """``PATHWAYS_NAMESPACE``: where island pods run (Events of islands go to ``default``);
    ``PATHWAYS_IMAGE``: the image of program Jobs; ``PATHWAYS_METRICS_PORT``: 0 disables
    metrics; ``PATHWAYS_RESYNC_SECONDS``: how often everything is reconciled again even when
    nothing changed; ``PATHWAYS_FAILURE_GRACE_SECONDS``: how long after its Job failed a run
    is judged (a failure, or an interruption if its island reports a host lost under it
    meanwhile); ``PATHWAYS_TENANTS``: the tenant policy, JSON ``{"team-a":
    {"namespaces": ["team-a"], "maxPriority": 100, "devices": {"tpu-v5e": 64}}, "*": {...}}``
    (see :mod:`pathways_core.control.tenants`);
    ``PATHWAYS_TLS_SECRET``: name of the ``kubernetes.io/tls`` Secret mounted in island and
    program pods (unset: TLS off); ``PATHWAYS_IMAGE_PULL_SECRETS``: comma-separated names of
    the Secrets island and program pods pull their images with (each in the pod's
    namespace); ``PATHWAYS_CONTROL_TOKENS``: ``true`` gives each island a random control token
    in a Secret of its own, read by its scheduler and executors (unset or ``false``: no token,
    for dev clusters); ``PATHWAYS_PEERING_LIFETIME_SECONDS``: how long a
    replica that stopped answering (killed, frozen, cut off) is held active by its peers
    before a standby takes over (kopf's 60 s kept the cluster unserved for a minute);
    ``PATHWAYS_SESSION_MASTER_KEY``: each island's scheduler takes sessions with a signed
    credential only, and each run gets its own (see docs/security.md)."""

    namespace: str = "pathways-system"
    image: str = DEFAULT_IMAGE
    metrics_port: int = 9090
    resync_seconds: float = 60.0
    failure_grace_seconds: float = FAILURE_GRACE_SECONDS
    tenants: Tenants = field(default_factory=Tenants)
    tls_secret: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    control_tokens: bool = False
    peering_lifetime_seconds: int = 20
    # The release's key islands' session keys are derived from (None: no session credentials).
    session_master_key: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_environment(cls) -> Config:
        """Read the settings; a malformed one raises naming the variable."""
        environ = os.environ
        raw = environ.get(TENANTS_ENV, "").strip()
        try:
            tenants = Tenants.from_wire(json.loads(raw)) if raw else Tenants()
        except ValueError as error:
            raise ValueError(
                f'{TENANTS_ENV}: expected JSON like {{"team-a": {{"maxPriority": 100, '
                f'"devices": {{"tpu-v5e": 64}}}}}} ({error})'
            ) from None
        return cls(
            namespace=environ.get("PATHWAYS_NAMESPACE") or cls.namespace,
            image=environ.get("PATHWAYS_IMAGE") or cls.image,
            metrics_port=int(_number("PATHWAYS_METRICS_PORT", cls.metrics_port)),
            resync_seconds=_number("PATHWAYS_RESYNC_SECONDS", cls.resync_seconds),
            failure_grace_seconds=_number(
                "PATHWAYS_FAILURE_GRACE_SECONDS", cls.failure_grace_seconds
            ),
            tenants=tenants,
            tls_secret=_secret_name(TLS_SECRET_ENV),
            image_pull_secrets=_secret_names(PULL_SECRETS_ENV),
            control_tokens=_flag(CONTROL_TOKENS_ENV),
            peering_lifetime_seconds=_peering_lifetime(),
            session_master_key=_master_key(),
        )


def _master_key() -> bytes | None:
    """``PATHWAYS_SESSION_MASTER_KEY``: on, each island's scheduler holds sessions to signed
    credentials; its key travels in the island's control Secret, so control tokens must be on."""
    raw = os.environ.get(MASTER_KEY_ENV, "")
    if not raw:
        return None
    key = check_key(raw, MASTER_KEY_ENV)
    if not _flag(CONTROL_TOKENS_ENV):
        raise ValueError(
            f"{MASTER_KEY_ENV} needs {CONTROL_TOKENS_ENV}=true: an island's session key travels "
            "in its control Secret"
        )
    return key


MIN_PEERING_LIFETIME_SECONDS = 15
"""kopf touches a replica's peering entry 5 to 10 s before it runs out: a shorter lifetime
would let a busy replica's entry run out between touches, and two replicas serve."""


def _peering_lifetime() -> int:
    variable = "PATHWAYS_PEERING_LIFETIME_SECONDS"
    value = _number(variable, Config.peering_lifetime_seconds)
    if value != int(value) or value < MIN_PEERING_LIFETIME_SECONDS:
        raise ValueError(
            f"{variable}: expected whole seconds >= {MIN_PEERING_LIFETIME_SECONDS}, got "
            f"{os.environ.get(variable)!r}"
        )
    return int(value)


def _flag(variable: str) -> bool:
    """A boolean setting: ``true``/``1``/``yes``/``on`` or ``false``/``0``/``no``/``off``
    (any case); unset or empty is false."""
    raw = os.environ.get(variable, "").strip().lower()
    if raw in ("", "false", "0", "no", "off"):
        return False
    if raw in ("true", "1", "yes", "on"):
        return True
    raise ValueError(f"{variable}: expected true or false, got {raw!r}")


def _secret_name(variable: str) -> str | None:
    """A Secret's name from the environment, or ``None`` when unset or empty."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    if not DNS_SUBDOMAIN.fullmatch(raw) or len(raw) > 253:
        raise ValueError(
            f"{variable}: expected the name of a Secret (a DNS subdomain), got {raw!r}"
        )
    return raw


def _secret_names(variable: str) -> tuple[str, ...]:
    """Secrets' names, comma-separated, from the environment (none when unset or empty)."""
    names = [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]
    for name in names:
        if not DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            raise ValueError(
                f"{variable}: expected names of Secrets (DNS subdomains) separated by commas, "
                f"got {name!r}"
            )
    return tuple(names)


def _number(variable: str, default: float) -> float:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{variable}: expected a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{variable}: expected a number >= 0, got {raw!r}")
    return value
