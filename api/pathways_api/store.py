"""What the API needs from a store, and the SQLite store of the embedded mode.

Two stores answer the same :class:`Store` interface: :class:`SqliteStore` (embedded mode, one
file in the state directory, WAL journal, also read and written by the embedded resource
manager) and ``kube_store.KubernetesStore`` (custom resources in a cluster).

Objects are the documents Kubernetes would hold (``apiVersion``, ``kind``, ``metadata``,
``spec``, ``status``); a tenant's objects live in the namespace named after it. Admission —
the quota check and the insert — is one ``BEGIN IMMEDIATE`` transaction, so concurrent
submissions (from any number of threads or processes) are never over-admitted.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from pathways_api.auth import Tenant
from pathways_api.errors import (
    Conflict,
    InvalidField,
    NotFound,
    QuotaExceeded,
    StoreBusy,
    StoreDamaged,
)
from pathways_api.logs import LogFile, Part
from pathways_core.control.common import (
    ANNOTATION_CANCELLED,
    ANNOTATION_RENEWED_AT,
    Document,
    Event,
    timestamp,
)
from pathways_core.control.slices import lease_expired, lease_expiry, renewal_stamp

PROGRAM, SLICE, ISLAND = "PathwaysProgram", "VirtualSlice", "Island"
TERMINAL = ("Succeeded", "Failed")
LABEL_SUBMITTED_BY = "pathways.dev/submitted-by"


@dataclass
class TracePage:
    """Part of a program's trace (its finished runs' island records, in run order), which
    runs lack their oldest records (an island keeps about 200,000 in all), and how many
    records there are."""

    records: list[dict[str, Any]]
    incomplete: list[str]
    total: int


TRACE_CHUNK = 10_000
"""Trace records stored together (a page reads the chunks it needs)."""
RUNS_KEPT = 16
"""The latest runs of a program whose traces and outputs are kept (a program restarted after
every preemption, which counts toward no limit, kept up to an island's whole trace and 1 GiB
of output a run, for good)."""


@dataclass(frozen=True)
class Usage:
    """What a tenant holds now: devices of its active programs and slices, active programs."""

    devices: int = 0
    programs: int = 0


@dataclass(frozen=True)
class Page:
    """One page of a list, and the token of the next one (``None`` at the end)."""

    items: list[Document]
    next: str | None


@dataclass(frozen=True)
class Admission:
    """What a new object costs against its tenant's quotas."""

    devices: int
    programs: int


class Store(Protocol):
    """Where the API keeps objects. Namespaced kinds take the tenant's namespace; Islands
    take ``None``."""

    async def admit(
        self,
        tenant: Tenant,
        document: Document,
        cost: Admission,
        idempotency: tuple[str, str] | None,
    ) -> tuple[Document, bool]:
        """Insert ``document`` if the tenant's quotas allow it, atomically; with an
        idempotency ``(key, fingerprint)``, a repeated key returns the object it created
        (``created`` False) and a key reused with another body is a Conflict (see
        :func:`check_replay`). Keys are per tenant and kind, and a key whose object is gone
        (removed, even if another was made since under its name) is free again."""
        ...

    async def get(self, kind: str, namespace: str | None, name: str) -> Document | None: ...

    async def list(
        self,
        kind: str,
        namespace: str | None,
        *,
        limit: int,
        token: str | None,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> Page: ...

    async def cancel(self, namespace: str, name: str) -> Document:
        """Suspend a program for good (it releases its devices); NotFound if absent."""
        ...

    async def suspend(self, namespace: str, name: str, suspend: bool) -> Document:
        """Set a program's ``spec.suspend``: while set its run is stopped and its devices
        released; cleared, its next run starts. NotFound if absent; Conflict if it finished
        or was cancelled. Setting it to what it is already changes nothing."""
        ...

    async def delete(
        self, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> Document:
        """Ask for deletion (the manager releases what it holds, then removes it); with
        ``uid``, only of that object (see :func:`check_uid`)."""
        ...

    async def renew(
        self, namespace: str, name: str, now: datetime, uid: str | None = None
    ) -> Document:
        """Renew a slice's lease at ``now`` (see :func:`check_renewable`)."""
        ...

    async def usage(self, namespace: str) -> Usage: ...

    async def events(self, kind: str, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """The Events of the object ``uid`` (not those of an earlier object of its name)."""
        ...

    async def logs(
        self, namespace: str, name: str, run: int | None = None
    ) -> list[tuple[int, Part]]:
        """Each run's number and output, oldest first (only run ``run``'s, if given)."""
        ...

    async def trace(self, namespace: str, name: str, start: int, limit: int) -> TracePage:
        """At most ``limit`` records of a program's trace from its ``start``-th."""
        ...

    async def ready(self) -> bool: ...


EVENTS_OF_GONE_OBJECTS_KEPT = timedelta(hours=1)
"""How long the Events of a removed object stay (a Kubernetes API server's default TTL)."""
EVENTS_KEPT = 200
"""Events kept per object, the latest (the API server keeps them an hour; a program that fails
and restarts all day would otherwise grow its list without end)."""


def now_text() -> str:
    """Now, as Kubernetes writes times."""
    return timestamp(datetime.now(UTC))


def encode_token(seq: int) -> str:
    """An opaque continue token."""
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


MAX_POSITION = 2**63 - 1
"""The largest position a token may stand for: SQLite's largest integer (a larger one was an
OverflowError, answered 500)."""


def decode_token(token: str) -> int:
    """The position a continue token stands for, or InvalidField."""
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        digits = text.removeprefix("seq:")
        if digits == text or not (digits.isascii() and digits.isdigit()):
            raise ValueError
        position = int(digits)
        if position > MAX_POSITION:
            raise ValueError
        return position
    except (ValueError, UnicodeDecodeError):
        raise InvalidField(
            "not a continue token given by a previous page", field="query continue"
        ) from None


def check_replay(stored_fingerprint: str | None, fingerprint: str) -> None:
    """The rule both stores apply when an Idempotency-Key names an object that is still
    there: the same body is a replay (the caller gets that object), another is a Conflict."""
    if stored_fingerprint != fingerprint:
        raise Conflict(
            "this Idempotency-Key was used for a different request body (for an object that "
            "still exists); use a new key for a new request",
            field="header Idempotency-Key",
        )


def is_cancelled(document: Document) -> bool:
    """Whether a program was cancelled (suspended for good)."""
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_CANCELLED) == "true"


def check_changeable(document: Document | None, name: str, action: str) -> Document:
    """The program ``document`` if ``action`` ("cancel", "be suspended", "resume") may be
    done to it: NotFound when absent or being deleted, Conflict when it finished or (unless
    cancelled again) was cancelled."""
    if document is None or document["metadata"].get("deletionTimestamp"):
        raise NotFound(f"no program named {name!r}", field="name")
    phase = (document.get("status") or {}).get("phase")
    if phase in TERMINAL:
        raise Conflict(f"program {name!r} already {phase.lower()}", field="name")
    if action != "cancel" and is_cancelled(document):
        raise Conflict(
            f"program {name!r} was cancelled, so it cannot {action}; delete it, then submit "
            "it again (cancelled programs stay suspended for good)",
            field="name",
        )
    return document


def check_uid(document: Document | None, kind: str, name: str, uid: str | None) -> None:
    """NotFound if ``uid`` is given and ``document`` is another object of its name: the one
    the caller holds was deleted, and this one made since (renewing or deleting it would
    take over or end someone else's)."""
    if document is not None and uid and document["metadata"].get("uid") != uid:
        raise NotFound(
            f"no {kind} named {name!r} of uid {uid!r}: it was deleted, and the one of its name "
            "was made since",
            field="uid",
        )


def check_renewable(
    document: Document | None, name: str, now: datetime, uid: str | None = None
) -> Document:
    """The slice ``document`` if its lease may be renewed at ``now``: NotFound when absent or
    being deleted, Conflict when it has no lease or the controller released it for its lease.
    A lease past its length is still renewed until then: the controller decides (it holds a
    slice a program names, and gives holders a lease's length after it starts), and its
    release, a compare-and-set on the slice, fails once a renewal changed it."""
    if document is None or document["metadata"].get("deletionTimestamp"):
        raise NotFound(f"no virtual slice named {name!r}", field="name")
    check_uid(document, "virtual slice", name, uid)
    if lease_expired(document):
        raise Conflict(
            f"the lease of virtual slice {name!r} ran out and its devices are released: "
            "delete it and create a new slice",
            field="name",
        )
    if lease_expiry(document, now) is None:
        raise Conflict(
            f"virtual slice {name!r} has no spec.leaseSeconds: it is held until deleted, "
            "with no lease to renew",
            field="spec.leaseSeconds",
        )
    return document


def renewed(document: Document, now: datetime) -> Document:
    """``document`` with its lease renewed at ``now``."""
    document["metadata"].setdefault("annotations", {})[ANNOTATION_RENEWED_AT] = renewal_stamp(now)
    return document


def is_active(document: Document) -> bool:
    """Whether an object counts against its tenant's quotas."""
    meta = document.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    phase = (document.get("status") or {}).get("phase")
    if document.get("kind") == PROGRAM:
        return phase not in TERMINAL and not is_cancelled(document)
    if document.get("kind") == SLICE:
        return phase != "Released"
    return False


SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    devices INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 0,
    phase TEXT,
    settled INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL,
    UNIQUE (kind, namespace, name)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    type TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL, time TEXT NOT NULL,
    uid TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_of ON events (kind, namespace, name);
-- A key names the object it created by uid: one made since under its name is not it. Rows go
-- with their object (remove), so they do not outgrow the objects.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    namespace TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
    name TEXT NOT NULL, uid TEXT NOT NULL,
    PRIMARY KEY (namespace, kind, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_of ON idempotency_keys (kind, namespace, name);
CREATE TABLE IF NOT EXISTS traces (
    namespace TEXT NOT NULL, name TEXT NOT NULL, run INTEGER NOT NULL, records TEXT NOT NULL,
    PRIMARY KEY (namespace, name, run)
);
-- A run's trace records in chunks of TRACE_CHUNK, so a page of a large trace parses only its
-- own (its traces row holds what else is known of the run; before chunks, the records).
CREATE TABLE IF NOT EXISTS trace_chunks (
    namespace TEXT NOT NULL, name TEXT NOT NULL, run INTEGER NOT NULL, chunk INTEGER NOT NULL,
    count INTEGER NOT NULL, records TEXT NOT NULL,
    PRIMARY KEY (namespace, name, run, chunk)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
-- What each tenant holds, kept by triggers so admission reads one row, not every object.
CREATE TABLE IF NOT EXISTS usage (
    namespace TEXT PRIMARY KEY,
    devices INTEGER NOT NULL DEFAULT 0,
    programs INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER IF NOT EXISTS usage_insert AFTER INSERT ON objects WHEN NEW.active = 1
BEGIN
    INSERT INTO usage (namespace) VALUES (NEW.namespace) ON CONFLICT DO NOTHING;
    UPDATE usage SET devices = devices + NEW.devices,
        programs = programs + (NEW.kind = 'PathwaysProgram')
    WHERE namespace = NEW.namespace;
END;
CREATE TRIGGER IF NOT EXISTS usage_delete AFTER DELETE ON objects WHEN OLD.active = 1
BEGIN
    UPDATE usage SET devices = devices - OLD.devices,
        programs = programs - (OLD.kind = 'PathwaysProgram')
    WHERE namespace = OLD.namespace;
END;
CREATE TRIGGER IF NOT EXISTS usage_update AFTER UPDATE OF active ON objects
WHEN OLD.active != NEW.active
BEGIN
    INSERT INTO usage (namespace) VALUES (NEW.namespace) ON CONFLICT DO NOTHING;
    UPDATE usage SET devices = devices + (NEW.active - OLD.active) * NEW.devices,
        programs = programs + (NEW.active - OLD.active) * (NEW.kind = 'PathwaysProgram')
    WHERE namespace = NEW.namespace;
END;
INSERT OR IGNORE INTO meta (key, value) VALUES ('resourceVersion', 0);
"""


logger = logging.getLogger("pathways.store")
# The table of an initialized store that holds what nothing else can make again: missing, it
# was dropped or lost, and recreating it empty would silently lose every object. (Events,
# traces and idempotency keys are made again empty; usage from the objects, at every start.)
DATA_TABLE = "objects"
BUSY_TIMEOUT_SECONDS = 30.0
"""How long a write waits for another writer (the manager, another API process) to let go of
the file's lock before it fails."""

API_BUSY_TIMEOUT_SECONDS = 10.0
"""The same for a request to the API, counted from the request (503 StoreBusy then): well
under the 30 s a client waits for an answer, so a write is never done after its client gave
up (and was told it failed)."""

T = TypeVar("T")
P = ParamSpec("P")


def is_busy(error: sqlite3.OperationalError) -> bool:
    """Whether ``error`` is SQLite giving up waiting for a lock another connection holds
    ("database is locked"), by its result code (extended codes keep the primary one)."""
    return error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class _OutOfTime(Exception):
    """A queued write's turn came after its request's busy timeout: nothing was done."""


class SqliteStore:
    """Objects in one SQLite file. Thread-safe: one connection per thread; writers serialize
    on SQLite's lock (``BEGIN IMMEDIATE``), so several processes may share the file."""

    def __init__(
        self,
        path: Path,
        logs: Path | None = None,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
    ) -> None:
        self.path = path
        self.log_dir = logs or path.parent / "logs"
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._writer: ThreadPoolExecutor | None = None  # started at the first write
        try:
            existing = {
                row[0]
                for row in self._db().execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as error:  # not a database, not readable or writable
            raise StoreDamaged(
                f"{path} cannot be used as the store: {error}. Make it readable and writable "
                "by this user, restore it from a backup, or move it away to start afresh"
            ) from None
        if "meta" in existing and DATA_TABLE not in existing:
            raise StoreDamaged(
                f"{path} lacks its table {DATA_TABLE}: it was damaged or edited. Restore it "
                "from a backup, or move it away to start with an empty store"
            )
        self._db().executescript(SCHEMA)
        # What each tenant holds is derived from the objects: made again at every start, so
        # a count that drifted (a file edited by hand) does not skew admission for good.
        with self._transaction() as db:
            db.execute("DELETE FROM usage")
            db.execute(
                "INSERT INTO usage (namespace, devices, programs) SELECT namespace, "
                "SUM(devices), SUM(kind = 'PathwaysProgram') FROM objects WHERE active = 1 "
                "GROUP BY namespace"
            )
        columns = {row[1] for row in self._db().execute("PRAGMA table_info(events)")}
        if "uid" not in columns:  # a state folder from before Events carried their object's uid
            self._db().execute("ALTER TABLE events ADD COLUMN uid TEXT NOT NULL DEFAULT ''")
        self._migrate_idempotency_keys("idempotency" in existing)

    def _migrate_idempotency_keys(self, old_table: bool) -> None:
        """Keys of a state folder from before keys named their object's kind and uid are kept
        for the objects of their name there now; keys whose object is gone are dropped (they
        are free: made again, a key of a removed object replayed the next one of its name)."""
        uid = "CASE WHEN json_valid(o.body) THEN json_extract(o.body, '$.metadata.uid') END"
        with self._transaction() as db:
            if old_table:
                db.execute(
                    "INSERT OR IGNORE INTO idempotency_keys "
                    "(namespace, kind, key, fingerprint, name, uid) "
                    f"SELECT i.namespace, o.kind, i.key, i.fingerprint, i.name, {uid} "
                    "FROM idempotency i JOIN objects o "
                    "ON o.namespace = i.namespace AND o.name = i.name "
                    f"WHERE o.kind IN (?, ?) AND {uid} IS NOT NULL",
                    (PROGRAM, SLICE),
                )
                db.execute("DROP TABLE idempotency")
            db.execute(
                "DELETE FROM idempotency_keys WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE "
                "o.kind = idempotency_keys.kind AND o.namespace = idempotency_keys.namespace "
                "AND o.name = idempotency_keys.name)"
            )

    # -- connection ----------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        # A call tried on the event loop (see _first_on_loop) uses a connection that never
        # waits for the lock; any other, one that waits up to busy_timeout.
        quick = getattr(self._local, "quick", False)
        attribute = "quick_db" if quick else "db"
        db = getattr(self._local, attribute, None)
        if db is None:
            timeout = 0.0 if quick else self.busy_timeout
            db = sqlite3.connect(self.path, isolation_level=None, timeout=timeout)
            db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a crash may lose the last transactions but never corrupts the file.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            setattr(self._local, attribute, db)
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            # (A COMMIT that failed too: left open, the thread's connection could start no
            # other transaction.)
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close this thread's connections."""
        for attribute in ("db", "quick_db"):
            db = getattr(self._local, attribute, None)
            if db is not None:
                db.close()
                setattr(self._local, attribute, None)

    @staticmethod
    def _next_version(db: sqlite3.Connection) -> str:
        row = db.execute(
            "UPDATE meta SET value = value + 1 WHERE key = 'resourceVersion' RETURNING value"
        ).fetchone()
        return str(row[0])

    # -- synchronous API (the manager's) ---------------------------------------------------------

    def insert(self, document: Document, devices: int = 0) -> Document:
        """Create an object as the manager does (children, islands); Conflict if it exists."""
        with self._transaction() as db:
            return self._insert(db, document, devices)

    def _insert(self, db: sqlite3.Connection, document: Document, devices: int) -> Document:
        meta = document.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        # To the microsecond: objects made within a second queue in the order they came.
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_version(db)
        try:
            db.execute(
                "INSERT INTO objects (kind, namespace, name, devices, active, phase, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    document["kind"],
                    meta.get("namespace") or "",
                    meta["name"],
                    devices,
                    int(is_active(document)),
                    (document.get("status") or {}).get("phase"),
                    json.dumps(document, sort_keys=True),
                ),
            )
        except sqlite3.IntegrityError:
            row = db.execute(
                "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                (document["kind"], meta.get("namespace") or "", meta["name"]),
            ).fetchone()
            deleting = row and (self._parsed(row[0], document).get("metadata") or {}).get(
                "deletionTimestamp"
            )
            raise Conflict(
                f"a {document['kind']} named {meta['name']!r} "
                + (
                    "is still being deleted; submit it again once it is gone"
                    if deleting
                    else "already exists"
                ),
                field="metadata.name",
            ) from None
        return document

    def read(self, kind: str, namespace: str | None, name: str) -> Document | None:
        """One object, or ``None``."""
        row = (
            self._db()
            .execute(
                "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                (kind, namespace or "", name),
            )
            .fetchone()
        )
        return self._parsed(row[0], kind, namespace, name) if row else None

    def read_all(self, kind: str, unsettled_only: bool = False) -> list[Document]:
        """Every object of a kind (the manager's snapshot), oldest first; one whose stored
        body is damaged is left out, logged (the rest of the cluster goes on)."""
        query = "SELECT seq, body FROM objects WHERE kind = ?"
        if unsettled_only:
            query += " AND settled = 0"
        rows = self._db().execute(query + " ORDER BY seq", (kind,)).fetchall()
        return self._readable(kind, rows)

    def _readable(self, kind: str, rows: list[tuple[int, str]]) -> list[Document]:
        """The documents of ``(seq, body)`` rows, leaving out (and logging) damaged ones."""
        documents = []
        for seq, body in rows:
            try:
                documents.append(self._parsed(body, kind, seq=seq))
            except StoreDamaged as damaged:
                logger.error("%s", damaged.message)
        return documents

    def _parsed(
        self,
        body: str,
        kind: str | Document,
        namespace: str | None = None,
        name: str | None = None,
        *,
        seq: int | None = None,
    ) -> Document:
        """A stored object's document; ``StoreDamaged`` naming it when its body is not one."""
        if isinstance(kind, dict):  # the document it stands for, as written
            meta = kind.get("metadata") or {}
            kind, namespace, name = kind["kind"], meta.get("namespace"), meta.get("name")
        try:
            document = json.loads(body)
            if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
                return document
            problem = "is not an object with metadata"
        except (ValueError, TypeError) as error:
            problem = f"is not valid JSON ({error})"
        which = f"{kind} {namespace}/{name}" if name is not None else f"a {kind} (row {seq})"
        row = f"seq = {seq}" if seq is not None else f"kind = '{kind}' AND name = '{name}'"
        raise StoreDamaged(
            f"the stored body of {which} in {self.path} {problem}: the file was damaged or "
            f"edited. Restore it from a backup, or drop the object: sqlite3 {self.path} "
            f'"DELETE FROM objects WHERE {row}"'
        )

    def replace(
        self,
        document: Document,
        change: Callable[[Document], Document | None],
        *,
        bump_generation: bool = False,
        settled: bool | None = None,
    ) -> Document | None:
        """Apply ``change`` to the stored object if it still has the resourceVersion of
        ``document`` (compare-and-set); ``None`` if it changed or went since it was read."""
        meta = document["metadata"]
        with self._transaction() as db:
            row = db.execute(
                "SELECT body, settled FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                (document["kind"], meta.get("namespace") or "", meta["name"]),
            ).fetchone()
            if row is None:
                return None
            stored = self._parsed(row[0], document)
            if stored["metadata"].get("resourceVersion") != meta.get("resourceVersion"):
                return None
            new = change(stored)
            if new is None:
                return stored
            if bump_generation:
                new["metadata"]["generation"] = int(new["metadata"].get("generation") or 1) + 1
            new["metadata"]["resourceVersion"] = self._next_version(db)
            db.execute(
                "UPDATE objects SET body = ?, active = ?, phase = ?, settled = ? "
                "WHERE kind = ? AND namespace = ? AND name = ?",
                (
                    json.dumps(new, sort_keys=True),
                    int(is_active(new)),
                    (new.get("status") or {}).get("phase"),
                    int(settled) if settled is not None else (0 if bump_generation else row[1]),
                    new["kind"],
                    meta.get("namespace") or "",
                    meta["name"],
                ),
            )
            return new

    def write_status(
        self, document: Document, status: dict[str, Any], settled: bool | None = None
    ) -> Document | None:
        """Replace an object's status (compare-and-set on its resourceVersion)."""

        def change(stored: Document) -> Document:
            return {**stored, "status": status}

        return self.replace(document, change, settled=settled)

    def settle(self, kind: str, namespace: str | None, name: str, settled: bool = True) -> None:
        """Mark an object as needing no reconcile until it changes (or needing one)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE objects SET settled = ? WHERE kind = ? AND namespace = ? AND name = ?",
                (int(settled), kind, namespace or "", name),
            )

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        """Forget an object (after its finalization), and, of a program, its runs' traces
        and logs (a later program of its name starts with none of them). Its Events stay an
        hour, as a Kubernetes API server keeps them (they are served by uid: never as another
        object's); older Events of objects gone are dropped here."""
        where = (kind, namespace or "", name)
        expired = timestamp(datetime.now(UTC) - EVENTS_OF_GONE_OBJECTS_KEPT)
        with self._transaction() as db:
            row = db.execute(
                "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?", where
            ).fetchone()
            db.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", where)
            # Its keys are free once it is gone (and their rows would otherwise pile up).
            db.execute(
                "DELETE FROM idempotency_keys WHERE kind = ? AND namespace = ? AND name = ?", where
            )
            db.execute(
                "DELETE FROM events WHERE time < ? AND uid NOT IN (SELECT json_extract(body, "
                "'$.metadata.uid') FROM objects WHERE json_extract(body, '$.metadata.uid') "
                "IS NOT NULL)",
                (expired,),
            )
            if kind == PROGRAM:
                for table in ("traces", "trace_chunks"):
                    db.execute(
                        f"DELETE FROM {table} WHERE namespace = ? AND name = ?",
                        (namespace or "", name),
                    )
        if kind == PROGRAM and row is not None:
            try:
                runs = int(
                    (self._parsed(row[0], kind, namespace, name).get("status") or {})["runs"]
                )
            except (StoreDamaged, KeyError, TypeError, ValueError):  # no runs, or unreadable
                runs = 0
            for run in range(1, runs + 1):
                self.log_path(namespace or "", f"{name}-run-{run}").unlink(missing_ok=True)

    def mark_deleting(
        self, kind: str, namespace: str | None, name: str, uid: str | None = None
    ) -> Document | None:
        """Set deletionTimestamp (idempotent); ``None`` if absent; NotFound if ``uid`` is
        given and the object is another (see :func:`check_uid`)."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                (kind, namespace or "", name),
            ).fetchone()
            if row is None:
                return None
            document = self._parsed(row[0], kind, namespace, name)
            check_uid(document, kind, name, uid)
            if document["metadata"].get("deletionTimestamp"):
                return document
            document["metadata"]["deletionTimestamp"] = now_text()
            document["metadata"]["resourceVersion"] = self._next_version(db)
            db.execute(
                "UPDATE objects SET body = ?, active = 0, settled = 0 "
                "WHERE kind = ? AND namespace = ? AND name = ?",
                (json.dumps(document, sort_keys=True), kind, namespace or "", name),
            )
            return document

    def record_events(self, events: list[Event]) -> None:
        """Store Events (the API serves them per object, by uid), keeping each object's last
        :data:`EVENTS_KEPT`."""
        if not events:
            return
        targets = {
            (e.target.kind, e.target.namespace or "", e.target.name, e.target.uid or "")
            for e in events
        }
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO events (kind, namespace, name, uid, type, reason, message, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        e.target.kind,
                        e.target.namespace or "",
                        e.target.name,
                        e.target.uid or "",
                        e.type,
                        e.reason,
                        e.message,
                        now_text(),
                    )
                    for e in events
                ],
            )
            of_target = "kind = ? AND namespace = ? AND name = ? AND uid = ?"
            db.executemany(
                f"DELETE FROM events WHERE {of_target} AND id <= (SELECT id FROM events WHERE "
                f"{of_target} ORDER BY id DESC LIMIT 1 OFFSET ?)",
                [(*target, *target, EVENTS_KEPT) for target in targets],
            )

    def store_trace(
        self,
        namespace: str,
        name: str,
        run: int,
        records: list[Any],
        incomplete: Mapping[str, str] | None = None,
        uid: str | None = None,
    ) -> None:
        """Keep the trace records of one run of a program (in chunks), and why islands lack
        some of them (``incomplete``: island -> why); with ``uid``, only while that program
        is there (taken after it was deleted, they were the next program's of its name). Of
        the program's runs, the latest ``RUNS_KEPT`` runs' traces are kept."""
        chunks = [records[i : i + TRACE_CHUNK] for i in range(0, len(records), TRACE_CHUNK)]
        kept = {"incomplete": dict(incomplete or {}), "chunks": len(chunks)}
        where = (namespace, name, run)
        with self._transaction() as db:
            if (
                uid is not None
                and not db.execute(
                    "SELECT 1 FROM objects WHERE kind = ? AND namespace = ? AND name = ? AND "
                    "json_extract(body, '$.metadata.uid') = ?",
                    (PROGRAM, namespace, name, uid),
                ).fetchone()
            ):
                return
            (latest,) = db.execute(
                "SELECT max(run) FROM traces WHERE namespace = ? AND name = ?", where[:2]
            ).fetchone()
            oldest_kept = max(run, latest or 0) - RUNS_KEPT + 1
            if run < oldest_kept:  # taken late, after newer runs': no longer kept
                return
            for table in ("traces", "trace_chunks"):
                db.execute(
                    f"DELETE FROM {table} WHERE namespace = ? AND name = ? AND run < ?",
                    (*where[:2], oldest_kept),
                )
            db.execute(
                "DELETE FROM trace_chunks WHERE namespace = ? AND name = ? AND run = ?", where
            )
            db.executemany(
                "INSERT INTO trace_chunks (namespace, name, run, chunk, count, records) "
                "VALUES (?,?,?,?,?,?)",
                [(*where, i, len(chunk), json.dumps(chunk)) for i, chunk in enumerate(chunks)],
            )
            db.execute(
                "INSERT OR REPLACE INTO traces (namespace, name, run, records) VALUES (?,?,?,?)",
                (*where, json.dumps(kept)),
            )

    def log_path(self, namespace: str, job: str) -> Path:
        """Where the output of a Job's process goes."""
        return self.log_dir / namespace / f"{job}.log"

    # -- the Store interface ---------------------------------------------------------------------
    # A call runs on the event loop, on a connection that does not wait for the file's lock;
    # held by another writer (the manager, another API process), the call goes off the loop
    # to wait up to busy_timeout for it (waiting on the loop froze every other request and
    # /healthz with it). Every call is one statement or one transaction (compare-and-set where
    # it reads first), and a busy lock stops it before its transaction changes anything, so
    # it runs again whole. (Every call sent to a thread halved the submissions a second the
    # API took: a thread's round trip costs more than most of these calls.)

    async def _write_off_loop(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call`` (a write): on the loop, or, the lock taken, on the store's writing thread
        (writes waiting there take turns); SQLite's lock held by another past
        ``busy_timeout`` is StoreBusy (503, nothing done), not a bare 500."""
        done, result = self._first_on_loop(call, *args, **kwargs)
        if done:
            return result  # type: ignore[return-value]
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="store-writes")
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.busy_timeout
        return await self._busy_is_503(
            loop.run_in_executor(
                self._writer, functools.partial(self._until, deadline, call, *args, **kwargs)
            )
        )

    def _until(self, deadline: float, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call`` on the writing thread, waiting for the lock until ``deadline`` only: the
        busy timeout counts from the request, not from its turn (writes queued behind one
        another were answered StoreBusy a busy timeout apart, and done past it)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _OutOfTime
        db = self._db()
        db.execute(f"PRAGMA busy_timeout={int(remaining * 1000)}")
        try:
            return call(*args, **kwargs)
        finally:
            db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")

    async def _read_off_loop(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call`` (a read): on the loop, or, kept waiting (WAL: rarely), on a thread."""
        done, result = self._first_on_loop(call, *args, **kwargs)
        if done:
            return result  # type: ignore[return-value]
        return await self._busy_is_503(asyncio.to_thread(call, *args, **kwargs))

    def _first_on_loop(
        self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> tuple[bool, T | None]:
        """``(True, call(...))``, or ``(False, None)`` if the lock is held by another."""
        self._local.quick = True
        try:
            return True, call(*args, **kwargs)
        except sqlite3.OperationalError as error:
            if not is_busy(error):
                raise
            return False, None
        finally:
            self._local.quick = False

    async def _busy_is_503(self, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except (sqlite3.OperationalError, _OutOfTime) as error:
            if isinstance(error, sqlite3.OperationalError) and not is_busy(error):
                raise
            raise StoreBusy(
                f"the store is busy: another writer held its database for "
                f"{self.busy_timeout:g} s; nothing was done, retry in a moment",
                headers={"Retry-After": "1"},
            ) from None

    async def admit(
        self,
        tenant: Tenant,
        document: Document,
        cost: Admission,
        idempotency: tuple[str, str] | None,
    ) -> tuple[Document, bool]:
        """See :meth:`Store.admit`."""
        return await self._write_off_loop(self._admit, tenant, document, cost, idempotency)

    def _admit(
        self,
        tenant: Tenant,
        document: Document,
        cost: Admission,
        idempotency: tuple[str, str] | None,
    ) -> tuple[Document, bool]:
        namespace, kind = tenant.name, document["kind"]
        with self._transaction() as db:
            if idempotency is not None:
                key, fingerprint = idempotency
                where = (namespace, kind, key)
                row = db.execute(
                    "SELECT fingerprint, name, uid FROM idempotency_keys "
                    "WHERE namespace = ? AND kind = ? AND key = ?",
                    where,
                ).fetchone()
                if row is not None:
                    stored_fingerprint, name, uid = row
                    body = db.execute(
                        "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                        (kind, namespace, name),
                    ).fetchone()
                    existing = self._parsed(body[0], kind, namespace, name) if body else None
                    if existing is not None and existing["metadata"].get("uid") == uid:
                        check_replay(stored_fingerprint, fingerprint)
                        return existing, False
                    # Its object is gone (one of its name made since is another's): free.
                    db.execute(
                        "DELETE FROM idempotency_keys WHERE namespace = ? AND kind = ? AND key = ?",
                        where,
                    )
            row = db.execute(
                "SELECT devices, programs FROM usage WHERE namespace = ?", (namespace,)
            ).fetchone()
            check_quota(tenant, Usage(*row) if row else Usage(), cost)
            created = self._insert(db, document, cost.devices)
            if idempotency is not None:
                meta = created["metadata"]
                db.execute(
                    "INSERT INTO idempotency_keys (namespace, kind, key, fingerprint, name, uid) "
                    "VALUES (?,?,?,?,?,?)",
                    (namespace, kind, *idempotency, meta["name"], meta["uid"]),
                )
            return created, True

    async def get(self, kind: str, namespace: str | None, name: str) -> Document | None:
        """See :meth:`Store.get`."""
        return await self._read_off_loop(self.read, kind, namespace, name)

    async def list(
        self,
        kind: str,
        namespace: str | None,
        *,
        limit: int,
        token: str | None,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> Page:
        """See :meth:`Store.list`. Pages follow creation order; a token is a position, so
        objects created while paging appear on later pages and none is listed twice."""
        after = decode_token(token) if token else 0
        return await self._read_off_loop(self._list, kind, namespace, limit, after, phase, labels)

    def _list(
        self,
        kind: str,
        namespace: str | None,
        limit: int,
        after: int,
        phase: str | None,
        labels: dict[str, str] | None,
    ) -> Page:
        query = "SELECT seq, body FROM objects WHERE kind = ? AND namespace = ? AND seq > ?"
        parameters: list[Any] = [kind, namespace or "", after]
        if phase is not None:
            query += " AND phase = ?"
            parameters.append(phase)
        for key, value in (labels or {}).items():
            query += " AND json_extract(body, '$.metadata.labels.' || json_quote(?)) = ?"
            parameters += [key, value]
        rows = self._db().execute(query + " ORDER BY seq LIMIT ?", [*parameters, limit + 1])
        found = rows.fetchall()
        items = self._readable(kind, found[:limit])
        more = len(found) > limit
        return Page(items, encode_token(found[limit - 1][0]) if more and limit else None)

    async def cancel(self, namespace: str, name: str) -> Document:
        """See :meth:`Store.cancel`."""

        def change(stored: Document) -> Document | None:
            if is_cancelled(stored):
                return None
            stored["metadata"].setdefault("annotations", {})[ANNOTATION_CANCELLED] = "true"
            stored["spec"]["suspend"] = True
            return stored

        return await self._write_off_loop(self._change_program, namespace, name, "cancel", change)

    async def suspend(self, namespace: str, name: str, suspend: bool) -> Document:
        """See :meth:`Store.suspend`."""

        def change(stored: Document) -> Document | None:
            if bool(stored["spec"].get("suspend")) == suspend:
                return None
            stored["spec"]["suspend"] = suspend
            return stored

        action = "be suspended" if suspend else "resume"
        return await self._write_off_loop(self._change_program, namespace, name, action, change)

    def _change_program(
        self, namespace: str, name: str, action: str, change: Callable[[Document], Document | None]
    ) -> Document:
        """Apply ``change`` to a program whose state allows ``action`` (see
        :func:`check_changeable`); compare-and-set, so the check holds for what is changed."""
        for _ in range(10):
            document = check_changeable(self.read(PROGRAM, namespace, name), name, action)
            done = self.replace(document, change, bump_generation=True)
            if done is not None:
                return done
        raise Conflict(f"program {name!r} keeps changing; try again", field="name")

    async def delete(
        self, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> Document:
        """See :meth:`Store.delete`."""
        document = await self._write_off_loop(self.mark_deleting, kind, namespace, name, uid)
        if document is None:
            raise NotFound(f"no {kind} named {name!r}", field="name")
        return document

    async def renew(
        self, namespace: str, name: str, now: datetime, uid: str | None = None
    ) -> Document:
        """See :meth:`Store.renew`: compare-and-set, so the check holds for what is renewed;
        the slice stays settled (a renewal is no work for the manager)."""
        return await self._write_off_loop(self._renew, namespace, name, now, uid)

    def _renew(self, namespace: str, name: str, now: datetime, uid: str | None) -> Document:
        for _ in range(10):
            document = check_renewable(self.read(SLICE, namespace, name), name, now, uid)
            done = self.replace(document, lambda stored: renewed(stored, now))
            if done is not None:
                return done
        raise Conflict(f"virtual slice {name!r} keeps changing; try again", field="name")

    async def usage(self, namespace: str) -> Usage:
        """See :meth:`Store.usage`."""
        return await self._read_off_loop(self._usage, namespace)

    def _usage(self, namespace: str) -> Usage:
        row = (
            self._db()
            .execute("SELECT devices, programs FROM usage WHERE namespace = ?", (namespace,))
            .fetchone()
        )
        return Usage(*row) if row else Usage()

    async def events(self, kind: str, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """See :meth:`Store.events`."""
        return await self._read_off_loop(self._events, kind, namespace, name, uid)

    def _events(self, kind: str, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        rows = self._db().execute(
            "SELECT type, reason, message, time FROM events "
            "WHERE kind = ? AND namespace = ? AND name = ? AND uid = ? ORDER BY id",
            (kind, namespace, name, uid),
        )
        return [
            {"type": t, "reason": reason, "message": message, "time": time}
            for t, reason, message, time in rows.fetchall()
        ]

    async def logs(
        self, namespace: str, name: str, run: int | None = None
    ) -> list[tuple[int, Part]]:
        """See :meth:`Store.logs`: the runs' log files, as long as each is now."""
        return await self._read_off_loop(self._logs, namespace, name, run)

    def _logs(self, namespace: str, name: str, run: int | None) -> list[tuple[int, Part]]:
        document = self.read(PROGRAM, namespace, name)
        runs = int(((document or {}).get("status") or {}).get("runs") or 0)
        if run is not None and run <= runs - RUNS_KEPT:
            raise NotFound(
                f"the output of run {run} of program {name!r} is no longer kept: the latest "
                f"{RUNS_KEPT} runs' are (runs {runs - RUNS_KEPT + 1} to {runs})",
                field="query run",
            )
        numbers = range(max(1, runs - RUNS_KEPT + 1), runs + 1) if run is None else [run]
        paths = ((n, self.log_path(namespace, f"{name}-run-{n}")) for n in numbers)
        return [(n, LogFile(path)) for n, path in paths if path.exists()]

    async def trace(self, namespace: str, name: str, start: int, limit: int) -> TracePage:
        """See :meth:`Store.trace` (a page of a large trace takes a while to read)."""
        return await self._busy_is_503(
            asyncio.to_thread(self._trace_page, namespace, name, start, limit)
        )

    def _trace_page(self, namespace: str, name: str, start: int, limit: int) -> TracePage:
        db = self._db()
        where = (namespace, name)
        page = TracePage([], [], 0)
        # Where each run's records are: its chunks (their counts), or, kept before chunks
        # were, the run's row itself.
        pieces: list[tuple[int, Callable[[], list[dict[str, Any]]]]] = []
        runs = db.execute(
            "SELECT run, records FROM traces WHERE namespace = ? AND name = ? ORDER BY run", where
        ).fetchall()
        if runs and runs[-1][0] > RUNS_KEPT:
            page.incomplete.append(
                f"runs 1 to {runs[-1][0] - RUNS_KEPT}: their traces are no longer kept "
                f"(those of the latest {RUNS_KEPT} runs are)"
            )
        for run, text in runs:
            kept = json.loads(text)
            if isinstance(kept, list):
                pieces.append((len(kept), lambda kept=kept: kept))
                continue
            page.incomplete += [
                f"run {run} on island {island!r}: {why}"
                for island, why in (kept.get("incomplete") or {}).items()
            ]
            for chunk, count in db.execute(
                "SELECT chunk, count FROM trace_chunks WHERE namespace = ? AND name = ? AND "
                "run = ? ORDER BY chunk",
                (*where, run),
            ).fetchall():
                pieces.append((count, functools.partial(self._chunk, *where, run, chunk)))
        offset = 0
        for count, read in pieces:
            wanted = max(start - offset, 0), min(start + limit - offset, count)
            if wanted[0] < wanted[1]:  # only the chunks of the page are parsed
                page.records += read()[wanted[0] : wanted[1]]
            offset += count
        page.total = offset
        return page

    def _chunk(self, namespace: str, name: str, run: int, chunk: int) -> list[dict[str, Any]]:
        row = (
            self._db()
            .execute(
                "SELECT records FROM trace_chunks WHERE namespace = ? AND name = ? AND run = ? "
                "AND chunk = ?",
                (namespace, name, run, chunk),
            )
            .fetchone()
        )
        return json.loads(row[0]) if row else []

    async def ready(self) -> bool:
        """See :meth:`Store.ready`."""
        self._db().execute("SELECT 1").fetchone()
        return True


def check_quota(tenant: Tenant, usage: Usage, cost: Admission) -> None:
    """Raise QuotaExceeded if admitting ``cost`` would exceed the tenant's quotas."""
    if cost.programs and usage.programs + cost.programs > tenant.quotas.programs:
        raise QuotaExceeded(
            f"tenant {tenant.name!r} has {usage.programs} active programs of its quota of "
            f"{tenant.quotas.programs}",
            field="spec",
        )
    if usage.devices + cost.devices > tenant.quotas.devices:
        raise QuotaExceeded(
            f"tenant {tenant.name!r} would hold {usage.devices + cost.devices} devices, over its "
            f"quota of {tenant.quotas.devices} ({usage.devices} held now)",
            field="spec.slices" if cost.programs else "spec.devices",
        )
