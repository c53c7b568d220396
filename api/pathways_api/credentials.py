"""The islands' session keys, which the API signs tenants' session credentials with (an
island's scheduler opens sessions only for hellos carrying a credential its key signed: see
:mod:`pathways_core.wire.credentials`).

- Embedded: ``pathways up`` gives each island a random key and keeps them in
  ``DIR/session-keys.json``, readable by its user alone (:class:`SessionKeys`; the resource
  manager signs each run's credentials with them too).
- In a cluster: each island's key is derived from the release's master key and the Island's
  uid (:class:`DerivedSessionKeys`), as the operator derives it for the island's Secret.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Protocol

from pathways_core.control.common import Document
from pathways_core.wire.credentials import (
    SESSION_KEYS_FILE,
    SessionGrant,
    check_key,
    island_key,
    sign,
)

__all__ = ["SESSION_KEYS_FILE", "DerivedSessionKeys", "IslandKeys", "SessionKeys"]
logger = logging.getLogger("pathways.api")


class IslandKeys(Protocol):
    """Where the API finds an island's session key."""

    def key(self, island: Document) -> bytes | None: ...


class SessionKeys:
    """The keys of ``DIR/session-keys.json`` (island -> key), read again when the file changes
    (an island added by a later ``pathways up``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._keys: dict[str, bytes] = {}

    def key(self, island: Document) -> bytes | None:
        """The Island's key; None when it has none (its sessions need no credential)."""
        return self.key_named(str((island.get("metadata") or {}).get("name") or ""))

    def key_named(self, island: str) -> bytes | None:
        """The key of the island named ``island``; None when it has none."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._keys = None, {}
            return None
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            try:
                read = json.loads(self.path.read_text())
                self._keys = {
                    name: check_key(key, f"{self.path}: {name}") for name, key in read.items()
                }
            except (OSError, ValueError, AttributeError) as error:
                # Half a file cannot be: it is replaced whole. A broken one signs nothing.
                logger.error("%s cannot be read (%s): no credential is signed", self.path, error)
                self._keys = {}
            self._seen = seen
        return self._keys.get(island)

    def sign(self, grant: SessionGrant) -> str | None:
        """``grant`` signed with its island's key; None when the island has none."""
        key = self.key_named(grant.island)
        return None if key is None else sign(grant, key)


class DerivedSessionKeys:
    """A cluster's islands' keys, derived from the release's master key and each Island's
    uid (an island made before session credentials were on has no key in its Secret: its
    scheduler ignores the credential)."""

    def __init__(self, master: bytes) -> None:
        self._master = master

    def key(self, island: Document) -> bytes | None:
        """The Island's key; None for one without a uid."""
        uid = str((island.get("metadata") or {}).get("uid") or "")
        return island_key(self._master, uid).encode() if uid else None
