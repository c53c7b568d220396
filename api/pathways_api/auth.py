"""Who is calling: bearer tokens to tenants, and each tenant's quotas.

In embedded mode a tokens file (YAML or JSON) lists the tenants::

    tenants:
      team-a:
        tokens: [token-of-team-a]      # or sha256:<hex digest of the token>
        quotas: {devices: 8, programs: 20, priority: 100}
      team-b:
        tokens: [token-of-team-b]

A tenant is also the namespace its objects live in. In a cluster the Kubernetes store
authenticates with TokenReview instead (see ``kube_store``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from pathways_api.errors import Unauthorized
from pathways_core.resources.base import DNS_LABEL_PATTERN, MAX_PRIORITY

DEFAULT_QUOTAS = {"devices": 64, "programs": 100, "priority": MAX_PRIORITY}
# Each quota's least and greatest value: a priority cap may be negative, as priorities may.
QUOTA_BOUNDS = {
    "devices": (0, None),
    "programs": (0, None),
    "priority": (-MAX_PRIORITY, MAX_PRIORITY),
}


@dataclass(frozen=True)
class Quotas:
    """Limits of one tenant: devices held by its active programs and slices, programs not
    yet finished, and the highest priority its programs and slices may ask for (priorities
    decide who preempts whom: without a cap, any tenant could preempt every other)."""

    devices: int = DEFAULT_QUOTAS["devices"]
    programs: int = DEFAULT_QUOTAS["programs"]
    priority: int = DEFAULT_QUOTAS["priority"]


@dataclass(frozen=True)
class Tenant:
    """An authenticated caller."""

    name: str
    quotas: Quotas = field(default_factory=Quotas)


def quota(key: str, value: Any, name: str) -> int:
    """``value`` of quota ``key`` if it is a whole number within bounds, else ``ValueError``
    naming the setting ``name`` (never coerced: ``2.9``, ``"8"`` and ``true`` are refused,
    not read as 2, 8 and 1)."""
    low, high = QUOTA_BOUNDS[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ValueError(f"{name}: expected a whole number {bounds}, not {value!r}")
    return value


def quotas_from_environment(environment: Mapping[str, str]) -> Quotas:
    """Every tenant's quotas in a cluster: ``PATHWAYS_API_QUOTA_DEVICES``, ``_PROGRAMS`` and
    ``_PRIORITY`` (the priority cap defaults to 0: no tenant may preempt another unless
    allowed); ``ValueError`` naming the variable that is not a quota."""
    values: dict[str, int] = {"priority": 0}
    for key in DEFAULT_QUOTAS:
        variable = f"PATHWAYS_API_QUOTA_{key.upper()}"
        text = environment.get(variable, "").strip()
        if text:
            try:
                number: Any = int(text)
            except ValueError:
                number = text
            values[key] = quota(key, number, variable)
    return Quotas(**values)


class Authenticator(Protocol):
    """Turns a bearer token into a tenant, or raises :class:`Unauthorized`."""

    async def authenticate(self, token: str) -> Tenant: ...


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not header:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()


class TokensFileError(ValueError):
    """The tokens file is wrong; the message names the entry."""


class TokenFile:
    """Tokens and quotas read from a file (re-read when it changes on disk)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self._tokens: dict[str, Tenant] = {}
        self._digests: dict[str, Tenant] = {}
        self._checked = time.monotonic()
        self._load()

    @staticmethod
    def parse(document: Any, source: str = "tokens file") -> dict[str, Tenant]:
        """Token (or ``sha256:<hex>``) -> tenant, from the parsed file. A token listed
        under two tenants (itself, or once itself and once its digest) is refused, naming
        both entries and not the token: which tenant it is would depend on the order."""
        if not isinstance(document, Mapping) or not isinstance(document.get("tenants"), Mapping):
            raise TokensFileError(f"{source}: expected a mapping 'tenants: {{name: {{tokens}}}}'")
        tokens: dict[str, Tenant] = {}
        listed: dict[str, tuple[str, str]] = {}  # the token's digest -> (tenant, entry)
        for name, entry in document["tenants"].items():
            where = f"{source}: tenants.{name}"
            if not isinstance(name, str) or not re.match(DNS_LABEL_PATTERN, name):
                raise TokensFileError(f"{where}: a tenant name must be a lowercase RFC 1123 label")
            if not isinstance(entry, Mapping) or not isinstance(entry.get("tokens"), list):
                raise TokensFileError(f"{where}.tokens: expected a list of tokens")
            quotas = entry.get("quotas") or {}
            if not isinstance(quotas, Mapping):
                raise TokensFileError(f"{where}.quotas: expected a mapping of quotas")
            unknown = sorted(set(quotas) - set(DEFAULT_QUOTAS), key=str)
            if unknown:
                raise TokensFileError(
                    f"{where}.quotas: unknown quota {unknown[0]!r} "
                    f"(quotas are {', '.join(DEFAULT_QUOTAS)})"
                )
            try:
                checked = {k: quota(k, v, f"{where}.quotas.{k}") for k, v in quotas.items()}
            except ValueError as error:
                raise TokensFileError(str(error)) from None
            tenant = Tenant(name, Quotas(**checked))
            for index, token in enumerate(entry["tokens"]):
                if not isinstance(token, str) or not token:
                    raise TokensFileError(f"{where}.tokens: tokens are non-empty strings")
                digest = (
                    token[7:].lower()
                    if token.startswith("sha256:")
                    else hashlib.sha256(token.encode()).hexdigest()
                )
                entry_path = f"tenants.{name}.tokens[{index}]"
                other, first = listed.setdefault(digest, (name, entry_path))
                if other != name:
                    raise TokensFileError(
                        f"{source}: {entry_path}: the same token as {first}, of tenant "
                        f"{other!r}: a token authenticates one tenant; give {other!r} and "
                        f"{name!r} tokens of their own"
                    )
                tokens[token] = tenant
        return tokens

    def _load(self) -> None:
        mtime = self.path.stat().st_mtime
        if mtime == self._mtime:
            return
        text = self.path.read_text()
        document = json.loads(text) if self.path.suffix == ".json" else yaml.safe_load(text)
        tokens = self.parse(document, str(self.path))
        self._tokens = {t: v for t, v in tokens.items() if not t.startswith("sha256:")}
        self._digests = {t[7:]: v for t, v in tokens.items() if t.startswith("sha256:")}
        self._mtime = mtime

    def tenants(self) -> dict[str, Tenant]:
        """Every tenant of the file by name."""
        return {t.name: t for t in [*self._tokens.values(), *self._digests.values()]}

    async def authenticate(self, token: str) -> Tenant:
        """The tenant owning ``token``."""
        now = time.monotonic()
        if now - self._checked > 1.0:  # edits of the file apply within a second
            self._checked = now
            with contextlib.suppress(OSError, ValueError):  # keep the last good file
                self._load()
        for known, tenant in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return tenant
        digest = hashlib.sha256(token.encode()).hexdigest()
        for known, tenant in self._digests.items():
            if hmac.compare_digest(known, digest):
                return tenant
        raise Unauthorized("invalid bearer token")


def write_tokens_file(path: Path, tenants: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write a tokens file (used by ``pathways up`` and the tests)."""
    path.write_text(yaml.safe_dump({"tenants": dict(tenants)}, sort_keys=True))
    path.chmod(0o600)
    return path
