"""The islands' session keys of an embedded cluster, and the credentials signed with them.

``pathways up`` gives each island a random session key (its scheduler opens sessions only for
hellos carrying a credential that key signed: see :mod:`pathways_core.wire.credentials`) and
keeps them in ``DIR/session-keys.json``, readable by its user alone. The resource manager signs
each run's credentials with them; the API signs those of a tenant's own sessions.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from pathways_core.wire.credentials import SESSION_KEYS_FILE, SessionGrant, check_key, sign

__all__ = ["SESSION_KEYS_FILE", "SessionKeys"]
logger = logging.getLogger("pathways.api")


class SessionKeys:
    """The keys of ``DIR/session-keys.json`` (island -> key), read again when the file changes
    (an island added by a later ``pathways up``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._keys: dict[str, bytes] = {}

    def key(self, island: str) -> bytes | None:
        """``island``'s key; None when it has none (its sessions need no credential)."""
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
        key = self.key(grant.island)
        return None if key is None else sign(grant, key)
