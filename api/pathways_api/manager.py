"""The embedded resource manager: the operator's reconciliation decisions over the SQLite store.

``python -m pathways_api.manager --state DIR`` runs, in one process, what the kopf operator
and the cluster's controllers do in Kubernetes, with the same pure decisions of
``pathways_core.control``:

- islands: registered from ``DIR/islands.json`` (written by ``pathways up`` once its local
  islands answer, and again by its supervisor while it restarts a lost island: ready hosts,
  scheduler readiness, the new endpoint) as Islands whose scheduler runs outside the store
  (``pathways.dev/scheduler-endpoint``), their status from :func:`island_status`: Degraded
  (``HostsLost``) while the supervisor restarts one, so its slices are bound again elsewhere
  or wait, Preempted, and Ready again at the new endpoint;
- slices: binding passes of :func:`plan_bindings_shared` (``plan_bindings`` with
  time-shared groups), applied in stage order with compare-and-set writes, and one more when
  a slice's lease runs out;
- programs: :func:`reconcile_program`, whose children are applied to the store; a Job is run
  as a local subprocess with the Job's command and environment (the contract's
  ``PATHWAYS_*`` settings, ``PATHWAYS_RUN`` and ``PATHWAYS_CHECKPOINT_DIR``: a directory of
  the program's that outlives its runs), its output in ``DIR/logs``, its outcome written back
  as the Job controller would, and the island trace of its client kept for the API;
- deletion: what a deleted object holds is released before the object is removed.

The loop wakes every ``interval`` seconds and works only when the store changed (its
resourceVersion moved), ``islands.json`` changed or a Job ended, so an idle cluster costs one
query per tick. State is the store and the run records: every Job runs under
:mod:`pathways_api.run_job`, in a session of its own, which records its pid and writes its exit
status to ``DIR/runs``. A manager killed by SIGKILL leaves its runs running; the next one
restores the bindings from the slices' statuses, *adopts* the runs still running, and takes the
exit status of those that ended meanwhile. A run the cluster's stop took (``pathways down``
stops the manager with SIGTERM, which stops its runs; or the whole cluster was killed, its
runs with it) is *interrupted*, as a pod a node drain evicts is (its Job's podFailurePolicy
ignores a ``DisruptionTarget`` in a cluster): not the program's failure, so it counts toward
no restart limit; its Job starts again with the cluster (its output appended to the same log),
and its driver resumes from its checkpoint. A ``RunInterrupted`` Event on the program says
so.
A run that failed as its island went down under it (the supervisor reports a dead island
process within a fraction of a second) is interrupted too (``RunInterrupted``): a failed run
is judged :data:`FAILURE_GRACE_SECONDS` after it ended, so that the report comes first.

A run is stopped (suspended, cancelled, edited, past its deadline, deleted, or at ``down``) as
a pod is: SIGTERM, passed on to the command's process group, then SIGKILL of all it left after
the grace period (:data:`~pathways_api.run_job.GRACE_SECONDS`); the next run of its program
starts once it is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathways_api.credentials import SESSION_KEYS_FILE, SessionKeys
from pathways_api.lifeline import stop_when_stdin_closes
from pathways_api.run_job import (
    ALREADY_RUNNING,
    GRACE_SECONDS,
    MAX_OUTPUT_BYTES,
    is_wrapper_of,
    paths,
    process_start,
    read_json,
)
from pathways_api.store import ISLAND, PROGRAM, RUNS_KEPT, SLICE, SqliteStore, now_text
from pathways_core.control import (
    ANNOTATION_SCHEDULER_ENDPOINT,
    Event,
    IslandObservation,
    ObjectRef,
    ProgramView,
    Stage,
    is_deleting,
    island_status,
    job_name,
    parse,
    reconcile_program,
    slice_names,
)
from pathways_core.control.common import (
    LABEL_PROGRAM,
    Document,
    now_utc,
    parse_time,
    printable,
    prune,
)
from pathways_core.control.programs import CHECKPOINT_MOUNT, island_client_name, run_grants
from pathways_core.control.sharing import plan_bindings_shared
from pathways_core.resources import GROUP_VERSION, Island, PathwaysProgram
from pathways_core.wire.credentials import SESSION_CREDENTIALS_ENV, credentials_text

JOB, CONFIG_MAP = "Job", "ConfigMap"
KILL_MARGIN_SECONDS = 5.0
"""How long after its grace period a stopped run's wrapper (which kills what the command left
once the period is over) is given before its process groups are SIGKILLed."""
IMAGE = "pathways-embedded"
# How many times a Job's run was interrupted (started again after the cluster stopped).
INTERRUPTIONS = "pathways.dev/interruptions"
VANISHED = (
    "the driver's process ended while no resource manager watched it and left no exit status "
    "(it was killed)"
)

LAST_WORDS_CHARS = 1000
"""A failed run's last line in its status, at most (its start and end when longer)."""


FAILURE_GRACE_SECONDS = 2.0
"""How long after it ended a failed run is judged: the supervisor reports an island whose
process died down within a fraction of a second (it looks every 0.2 s)."""


class TraceUnavailable(RuntimeError):
    """A run's island trace could not be read (its island's answer, in one line)."""


logger = logging.getLogger("pathways_api.manager")


def island_document(name: str, entry: dict[str, Any]) -> Document:
    """The Island of a local island (``islands.json`` entry: endpoint, hosts,
    devicesPerHost, policy, and topology, one axis of all its devices when absent)."""
    hosts, per_host = int(entry["hosts"]), int(entry["devicesPerHost"])
    return {
        "apiVersion": GROUP_VERSION,
        "kind": ISLAND,
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION_SCHEDULER_ENDPOINT: entry["endpoint"]},
            "labels": {"pathways.dev/pool": "embedded"},
        },
        "spec": {
            "acceleratorKind": "cpu-fake",
            "topology": str(entry.get("topology") or hosts * per_host),
            "hosts": hosts,
            "devicesPerHost": per_host,
            "scheduler": {"policy": entry.get("policy", "fifo")},
        },
    }


def island_observation(entry: dict[str, Any]) -> IslandObservation:
    """What the supervisor reports of a local island: its ready hosts and whether its scheduler
    answers. An entry that reports nothing is Ready as declared."""
    if "schedulerReady" not in entry:
        return IslandObservation()
    hosts = frozenset(int(host) for host in entry.get("readyHosts") or [])
    return IslandObservation(
        scheduler_ready=1 if entry["schedulerReady"] else 0,
        executors_ready=len(hosts),
        ready_hosts=hosts,
    )


@dataclass
class Running:
    """A Job's process: the :mod:`pathways_api.run_job` wrapper this manager started
    (``popen``), or one a previous manager started and this one adopted (``popen`` is
    ``None``; ``pid`` and ``start`` tell it from a later process with the same pid)."""

    job: Document
    popen: subprocess.Popen[bytes] | None
    started: float
    deadline: float | None
    record: Path | None = None
    pid: int = 0
    start: int | None = None
    # Once stopped: when what is left of it is killed (SIGTERM gave it its grace period).
    kill_at: float | None = None

    def alive(self) -> bool:
        """Whether the run's process still runs."""
        if self.popen is not None:
            if self.popen.poll() is None:
                return True
            if self.popen.returncode != ALREADY_RUNNING or self.record is None:
                return False
            # Another wrapper runs this run (started by a manager that died before it
            # recorded it): follow that one.
            self.popen = None
            found = read_json(paths(self.record)[1]) or {}
            if found.get("uid") != self.job["metadata"].get("uid"):
                return False
            self.pid, self.start = int(found.get("pid") or 0), found.get("start")
        return self.pid > 0 and self.start is not None and process_start(self.pid) == self.start

    def exit_code(self) -> int | None:
        """The command's exit status (from the wrapper's exit file), else the wrapper's own,
        else ``None``: the process left none (it was killed with its wrapper)."""
        if self.record is not None:
            found = read_json(paths(self.record)[2]) or {}
            if found.get("uid") == self.job["metadata"].get("uid") and "code" in found:
                return int(found["code"])
        if self.popen is not None and self.popen.returncode is not None:
            return self.popen.returncode
        return None


class Manager:
    """Reconciles the store until stopped."""

    def __init__(
        self,
        store: SqliteStore,
        state: Path,
        *,
        interval: float = 0.1,
        cwd: Path | None = None,
        max_output: int = MAX_OUTPUT_BYTES,
        grace: float = GRACE_SECONDS,
    ) -> None:
        self.store = store
        self.state = state
        self.interval = interval
        self.max_output = max_output
        self.grace = grace
        self.cwd = cwd or Path.cwd()
        self.session_keys = SessionKeys(state / SESSION_KEYS_FILE)
        self.running: dict[str, Running] = {}
        self.terminating: list[Running] = []  # stopped runs, until they are gone
        self._stop = threading.Event()
        self._seen_version: int | None = None
        self._finishing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="job-finish")
        self._ended = threading.Event()
        self._islands_file: tuple[int, int, int] | None = None
        self._observed: dict[str, IslandObservation] = {}
        self._recheck_at: float | None = None  # monotonic time a decision asked to be redone
        # No lease runs out sooner than its length after this: while the cluster was down,
        # its slices' holders could not renew them.
        self._started = now_utc()

    # -- loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile until :meth:`stop`."""
        self.register_islands()
        self.adopt_jobs()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bug must not stop the cluster: log it, try again next tick
                logger.exception("reconcile failed; retrying")
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop the loop, stop running Jobs (all at once, each given its grace period) and
        record them as interrupted, to start again with the cluster."""
        self._stop.set()
        for running in self.running.values():
            self._kill(running)
        deadline = time.monotonic() + self.grace + 2 * KILL_MARGIN_SECONDS
        while self.terminating and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for running in list(self.running.values()):
            self._interrupt(running.job, "the embedded cluster stopped (pathways down, or its end)")
        self.running.clear()
        self._finishing.shutdown(wait=True)

    def tick(self) -> bool:
        """One round if anything changed; whether it did work."""
        self._poll_jobs()
        islands_changed = self._islands_changed()
        version = self._version()
        ended = self._ended.is_set()
        due = self._recheck_at is not None and time.monotonic() >= self._recheck_at
        if version == self._seen_version and not ended and not islands_changed and not due:
            return False
        self._ended.clear()
        self._recheck_at = None  # the decisions of this round ask again if they still wait
        for _ in range(20):  # until the decisions settle
            self._seen_version = self._version()
            self.reconcile_islands()
            self.bind()
            self.reconcile_programs()
            self.start_jobs()
            if self._version() == self._seen_version:
                break
        return True

    def _recheck_in(self, seconds: float) -> None:
        """Run a round in ``seconds`` even if nothing changes (a decision depends on time)."""
        due = time.monotonic() + max(seconds, 0.0)
        self._recheck_at = min(due, self._recheck_at or due)

    def _version(self) -> int:
        row = self.store._db().execute("SELECT value FROM meta WHERE key = 'resourceVersion'")
        return int(row.fetchone()[0])

    # -- islands -------------------------------------------------------------------------------

    def _islands_changed(self) -> bool:
        """Register the islands again if ``islands.json`` changed since it was last read."""
        try:
            stat = (self.state / "islands.json").stat()
        except OSError:
            return False
        if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == self._islands_file:
            return False
        self.register_islands()
        return True

    def register_islands(self) -> None:
        """Create or update the Islands listed in ``islands.json`` (their endpoints change
        when an island is started again) and keep what it reports of their health."""
        path = self.state / "islands.json"
        try:
            stat = path.stat()
            listed = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # absent, or read while replaced: the next tick reads it again
        self._islands_file = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        for name, entry in listed.items():
            self._observed[name] = island_observation(entry)
            wanted = island_document(name, entry)
            current = self.store.read(ISLAND, None, name)
            if current is None:
                self.store.insert(wanted)
                continue

            def change(stored: Document, wanted: Document = wanted) -> Document | None:
                if stored["spec"] == wanted["spec"] and stored["metadata"].get(
                    "annotations"
                ) == wanted["metadata"].get("annotations"):
                    return None
                spec_changed = stored["spec"] != wanted["spec"]
                stored["metadata"]["annotations"] = wanted["metadata"]["annotations"]
                stored["spec"] = wanted["spec"]
                if spec_changed:
                    stored["metadata"]["generation"] = stored["metadata"].get("generation", 1) + 1
                return stored

            self.store.replace(current, change)

    def reconcile_islands(self) -> None:
        """Write each island's status: Ready as declared, or as the supervisor reports it."""
        for document in self.store.read_all(ISLAND):
            if is_deleting(document):
                continue
            island, problem = parse(document)
            decision = island_status(
                document,
                island if isinstance(island, Island) else None,
                problem,
                self._observed.get(document["metadata"]["name"], IslandObservation()),
                "embedded",
                now_utc(),
            )
            old = document.get("status") or {}
            if any(old.get(key) != value for key, value in prune(decision.status).items()):
                new = {**old, **prune(decision.status)}
                if self.store.write_status(document, new) is not None:
                    self.store.record_events(decision.events)

    # -- slices --------------------------------------------------------------------------------

    def bind(self) -> None:
        """Binding passes until nothing is left to do at once."""
        for _ in range(10):
            islands = self.store.read_all(ISLAND)
            slices = self.store.read_all(SLICE)
            programs = self.store.read_all(PROGRAM)
            now = now_utc()
            plan = plan_bindings_shared(
                islands, slices, now, programs=programs, leases_since=self._started
            )
            if plan.next_expiry is not None:  # a pass then releases the slice unless renewed
                self._recheck_in((plan.next_expiry - now).total_seconds())
            again = plan.needs_another_pass
            released_ok = True
            for change in plan.ordered():
                if change.stage is Stage.BIND and not released_ok:
                    again = True  # devices move only once their release is stored
                    break
                if self.store.write_status(change.document, prune(change.status)) is None:
                    again = True
                    if change.stage is Stage.RELEASE:
                        released_ok = False
            self.store.record_events(plan.events)
            for island in islands:
                name = island["metadata"]["name"]
                if name not in plan.devices_free:
                    continue
                status = island.get("status") or {}
                free, total = plan.devices_free[name], plan.devices_total[name]
                if status.get("devicesFree") != free or status.get("devicesTotal") != total:
                    fresh = self.store.read(ISLAND, None, name)
                    if fresh is not None:
                        self.store.write_status(
                            fresh,
                            {
                                **(fresh.get("status") or {}),
                                "devicesFree": free,
                                "devicesTotal": total,
                            },
                        )
            # The finalizer: a deleted slice goes once its release is stored.
            for document in self.store.read_all(SLICE):
                if is_deleting(document) and (document.get("status") or {}).get("phase") in (
                    "Released",
                    None,
                ):
                    meta = document["metadata"]
                    self.store.remove(SLICE, meta.get("namespace"), meta["name"])
            if not again:
                return

    # -- programs ------------------------------------------------------------------------------

    def reconcile_programs(self) -> None:
        """One reconcile of every program not settled in a terminal phase."""
        # Each program's labelled slices (its inline ones), read once for the pass: a
        # program's decision touches no other program's.
        labelled: dict[tuple[str | None, str], dict[str, Document]] = {}
        for item in self.store.read_all(SLICE):
            meta = item["metadata"]
            program = (meta.get("labels") or {}).get(LABEL_PROGRAM)
            if program:
                labelled.setdefault((meta.get("namespace"), program), {})[meta["name"]] = item
        for document in self.store.read_all(PROGRAM, unsettled_only=True):
            if is_deleting(document):
                self._delete_program(document)
                continue
            meta = document["metadata"]
            self._reconcile(document, labelled.get((meta.get("namespace"), meta["name"]), {}))

    def _view(self, document: Document, labelled: dict[str, Document]) -> ProgramView:
        meta = document["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        program, _ = parse(document)
        slices: dict[str, Document | None] = {}
        islands: dict[str, Document] = {}
        if isinstance(program, PathwaysProgram):
            for vs in slice_names(program).values():
                slices[vs] = self.store.read(SLICE, namespace, vs)
                island = ((slices[vs] or {}).get("status") or {}).get("island")
                if island and island not in islands:
                    found = self.store.read(ISLAND, None, island)
                    if found is not None:
                        islands[island] = found
        runs = int((document.get("status") or {}).get("runs") or 0)
        # The current run's, and the next run's if one was made by a decision whose status
        # was never stored (an earlier program's go with it: deletion is synchronous here).
        jobs = {
            job_name(name, run): found
            for run in (runs, runs + 1)
            if run and (found := self.store.read(JOB, namespace, job_name(name, run)))
        }
        return ProgramView(
            document, slices, jobs.get(job_name(name, runs)), islands, labelled, jobs
        )

    def _reconcile(self, document: Document, labelled: dict[str, Document]) -> None:
        decision = reconcile_program(
            self._view(document, labelled),
            now_utc(),
            IMAGE,
            failure_grace=FAILURE_GRACE_SECONDS,
        )
        if decision.recheck_after is not None:
            self._recheck_in(decision.recheck_after)
        for child in decision.create:
            if self._read_child(child) is None:
                self.store.insert(child)
        for child in decision.apply:
            self._apply_child(child)
        if decision.deadline is not None:
            self._set_deadline(
                decision.deadline.job.namespace,
                decision.deadline.job.name,
                decision.deadline.seconds,
            )
        phase = (decision.status or document.get("status") or {}).get("phase")
        settled = phase in ("Succeeded", "Failed") and not decision.create and not decision.delete
        if decision.status is not None:
            if self.store.write_status(document, prune(decision.status), settled=settled) is None:
                return  # changed since read: the next pass decides again
        elif settled:
            meta = document["metadata"]
            self.store.settle(PROGRAM, meta.get("namespace"), meta["name"])
        # Deletions only once the status recording why is stored (as the operator does): a
        # run's Job gone under a status still saying it runs is a Job deleted by someone else.
        for ref in decision.delete:
            self._delete_child(ref.kind, ref.namespace, ref.name)
        self.store.record_events(decision.events)

    def _set_deadline(self, namespace: str, name: str, seconds: int | None) -> None:
        """A running Job's new ``activeDeadlineSeconds`` (the program's was edited)."""
        job = self.store.read(JOB, namespace, name)
        if job is not None:
            spec = {k: v for k, v in job["spec"].items() if k != "activeDeadlineSeconds"}
            if seconds is not None:
                spec["activeDeadlineSeconds"] = seconds
            self.store.replace(job, lambda stored: {**stored, "spec": spec})
        running = self.running.get(f"{namespace}/{name}")
        if running is not None:
            running.deadline = None if seconds is None else running.started + seconds

    def _read_child(self, child: Document) -> Document | None:
        meta = child["metadata"]
        return self.store.read(child["kind"], meta.get("namespace"), meta["name"])

    def _apply_child(self, child: Document) -> None:
        """Create a child, or replace its ``spec`` (a ConfigMap's ``data``) when it differs."""
        existing = self._read_child(child)
        if existing is None:
            self.store.insert(child)
            return
        content = "data" if "data" in child else "spec"
        if existing.get(content) != child[content]:
            self.store.replace(
                existing,
                lambda stored: {**stored, content: child[content]},
                bump_generation=content == "spec",
            )

    def _delete_child(self, kind: str, namespace: str, name: str) -> None:
        if kind == JOB:
            running = self.running.pop(f"{namespace}/{name}", None)
            if running is not None:
                self._kill(running)
            self.store.remove(JOB, namespace, name)
            if running is None or running not in self.terminating:
                self._forget(namespace, name)
            # else its record goes once it is gone (_reap): meanwhile, a manager started after
            # this one finds it still stopping (_adopt_stopping)
        elif kind == SLICE:
            self.store.mark_deleting(SLICE, namespace, name)
        else:
            self.store.remove(kind, namespace, name)

    def _delete_owned(self, owner: Document, kind: str, name: str) -> bool:
        """Delete a child of ``owner`` if ``owner`` owns it: a same-named object of the user's
        or of another program stays (a deleted program took a VirtualSlice it had refused as
        ``SliceNameTaken`` with it)."""
        namespace, uid = owner["metadata"].get("namespace"), owner["metadata"].get("uid")
        child = self.store.read(kind, namespace, name)
        references = ((child or {}).get("metadata") or {}).get("ownerReferences") or []
        if uid is None or not any(reference.get("uid") == uid for reference in references):
            return False
        self._delete_child(kind, namespace, name)
        return True

    def _delete_program(self, document: Document) -> None:
        """Release what a deleted program holds; remove it once its runs and slices are gone
        (a name is free only then: its checkpoints went, and so its run saving one at SIGTERM
        lost it, while ``pathways delete`` had said it was deleted)."""
        meta = document["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        # Its runs' Jobs, and one of a run its status never recorded.
        for run in range(1, int((document.get("status") or {}).get("runs") or 0) + 2):
            self._delete_owned(document, JOB, job_name(name, run))
        self._delete_owned(document, CONFIG_MAP, f"{name}-graph")
        remaining = int(self._stopping(namespace, name))
        for item in (document.get("spec") or {}).get("slices") or []:
            if isinstance(item, dict) and item.get("name") and not item.get("virtualSliceName"):
                remaining += self._delete_owned(document, SLICE, f"{name}-{item['name']}")
        if not remaining:
            self.store.remove(PROGRAM, namespace, name)
            if meta.get("uid"):
                shutil.rmtree(
                    self.state / "checkpoints" / (namespace or "") / name / meta["uid"],
                    ignore_errors=True,
                )

    # -- jobs ----------------------------------------------------------------------------------

    def adopt_jobs(self) -> None:
        """Runs a previous manager started: adopt those still running, take the outcome of
        those that ended meanwhile (at the next poll); a run that left no record was killed
        with the cluster: it is interrupted, to start again."""
        for job in self.store.read_all(JOB):
            status = job.get("status") or {}
            if not status.get("active") or status.get("conditions"):
                continue
            meta = job["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            running = self._adopt(job)
            if running is None:
                self._interrupt(job, "the cluster stopped while it ran (it left no exit status)")
            else:
                self.running[key] = running
                logger.info("adopted run %s (pid %d)", key, running.pid)
        self._adopt_stopping()

    def _adopt_stopping(self) -> None:
        """Runs a previous manager was stopping (its Job gone: suspended, cancelled, deleted)
        that still run, saving a checkpoint, say: stopped as they were, and no run of their
        program starts until they are gone (one did, beside them, sharing their checkpoint
        directory, when the manager restarted meanwhile)."""
        for record_file in sorted((self.state / "runs").glob("*/*.json")):
            namespace, name = record_file.parent.name, record_file.stem
            if f"{namespace}/{name}" in self.running or "-run-" not in name:
                continue
            if self.store.read(JOB, namespace, name) is not None:
                continue  # its Job is there: start_jobs adopts it, or it ended
            found = read_json(record_file) or {}
            pid, start = int(found.get("pid") or 0), found.get("start")
            if not pid or start is None or process_start(pid) != start:
                continue
            if not is_wrapper_of(pid, record_file.with_suffix("")):
                continue  # another cluster's run, in the state folder this one was copied from
            program = name.rsplit("-run-", 1)[0]
            job = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": found.get("uid"),
                    "labels": {LABEL_PROGRAM: program},
                }
            }
            stopping = Running(
                job,
                None,
                time.monotonic(),
                None,
                record=record_file.with_suffix(""),
                pid=pid,
                start=start,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # (again: its wrapper gives it its grace period)
            stopping.kill_at = time.monotonic() + self.grace + KILL_MARGIN_SECONDS
            self.terminating.append(stopping)
            logger.info("run %s/%s is still stopping (pid %d): waited for", namespace, name, pid)

    def _interrupt(self, job: Document, why: str) -> None:
        """Record a run the cluster's stop took as not started (its Job starts it again), one
        interruption more, with a ``RunInterrupted`` Event on its program."""
        meta = job["metadata"]

        def change(stored: Document) -> Document:
            annotations = stored["metadata"].setdefault("annotations", {})
            annotations[INTERRUPTIONS] = str(int(annotations.get(INTERRUPTIONS) or 0) + 1)
            stored["status"] = {}
            return stored

        for _ in range(5):
            if self.store.replace(job, change) is not None:
                break
            job = self.store.read(JOB, meta["namespace"], meta["name"])
            if job is None:
                return
        self._forget(meta["namespace"], meta["name"])
        program_name = (meta.get("labels") or {}).get(LABEL_PROGRAM)
        program = program_name and self.store.read(PROGRAM, meta["namespace"], program_name)
        if program:
            message = (
                f"its run ({meta['name']}) was interrupted: {why}; it starts again with the "
                "cluster, from its checkpoint (not counted as a restart)"
            )
            self.store.record_events(
                [Event(ObjectRef.of(program), "Warning", "RunInterrupted", message)]
            )
        logger.info("interrupted run %s/%s: %s", meta["namespace"], meta["name"], why)

    def _forget(self, namespace: str, name: str) -> None:
        """Remove a run's record files once its outcome is stored (or it is deleted)."""
        for path in paths(self.state / "runs" / namespace / name):
            path.unlink(missing_ok=True)

    def _record(self, job: Document) -> Path:
        """Prefix of a run's record files (see :mod:`pathways_api.run_job`)."""
        meta = job["metadata"]
        return self.state / "runs" / meta["namespace"] / meta["name"]

    def _adopt(self, job: Document) -> Running | None:
        """The run of ``job`` a previous manager started, if it left a record of it."""
        record = self._record(job)
        found = read_json(paths(record)[1]) or {}
        if found.get("uid") != job["metadata"].get("uid") or not found.get("pid"):
            return None
        pid, start = int(found["pid"]), found.get("start")
        if process_start(pid) == start and not is_wrapper_of(pid, record):
            # Running, but another cluster's (this state folder is a copy of its): this one's
            # run starts again here, leaving that one alone.
            return None
        deadline = None
        seconds = job["spec"].get("activeDeadlineSeconds")
        started = parse_time((job.get("status") or {}).get("startTime"))
        if seconds and started is not None:
            deadline = time.monotonic() + seconds - (now_utc() - started).total_seconds()
        return Running(
            job,
            None,
            time.monotonic(),
            deadline,
            record=record,
            pid=pid,
            start=start,
        )

    def start_jobs(self) -> None:
        """Start the process of every new Job (or adopt it, if a manager that died before it
        recorded the start had started it)."""
        for job in self.store.read_all(JOB):
            meta = job["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            if key in self.running or (job.get("status") or {}):
                continue
            if self._stopping(meta["namespace"], (meta.get("labels") or {}).get(LABEL_PROGRAM)):
                continue  # runs of one program never overlap: the last is still stopping
            running = self._adopt(job)
            if running is None:
                try:
                    running = self._start(job)
                except (OSError, ValueError) as error:  # (ValueError: a NUL in an argument)
                    # Failed alone: raised on, it stopped every later run of every tenant.
                    self._write_job(job, failed=True, message=f"could not start: {error}")
                    continue
            started = self.store.write_status(job, {"active": 1, "startTime": now_text()})
            if started is None:  # deleted or changed meanwhile: its next state decides
                self._kill(running)
                continue
            running.job = started
            self.running[key] = running

    def _forget_old_outputs(self, namespace: str, job: str) -> None:
        """Remove the logs of the program's runs older than the latest ``RUNS_KEPT`` (this
        one's included): each kept up to 1 GiB, however many runs preemptions made."""
        program, _, run = job.rpartition("-run-")
        if not run.isdigit():
            return
        for old in range(int(run) - RUNS_KEPT, 0, -1):
            path = self.store.log_path(namespace, job_name(program, old))
            if not path.exists():
                break  # (and those before it: removed as their runs went out of the latest)
            path.unlink(missing_ok=True)

    def _start(self, job: Document) -> Running:
        meta = job["metadata"]
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        if command and command[0] == "python":
            command[0] = sys.executable
        mounts = {}
        for volume in pod.get("volumes") or []:
            config_map = (volume.get("configMap") or {}).get("name")
            if not config_map:
                continue
            source = self.store.read(CONFIG_MAP, meta["namespace"], config_map)
            folder = self.state / "configmaps" / meta["namespace"] / config_map
            folder.mkdir(parents=True, exist_ok=True)
            for key, value in ((source or {}).get("data") or {}).items():
                (folder / key).write_text(value)
            mounts[volume["name"]] = folder
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in mounts:
                target = str(mounts[mount["name"]])
                command = [part.replace(mount["mountPath"], target) for part in command]
        environment = {item["name"]: item.get("value", "") for item in container.get("env", [])}
        checkpoints = self._checkpoint_dir(job)
        given = environment.get("PATHWAYS_CHECKPOINT_DIR")
        # A checkpointClaim's folder is on a volume of a cluster's: here, the state folder's.
        if checkpoints is not None and (given is None or given.startswith(f"{CHECKPOINT_MOUNT}/")):
            checkpoints.mkdir(parents=True, exist_ok=True)
            environment["PATHWAYS_CHECKPOINT_DIR"] = str(checkpoints)
        credentials = self._credentials(environment)
        if credentials:  # in the process's environment only, as a Secret's value in a pod
            environment[SESSION_CREDENTIALS_ENV] = credentials
        log = self.store.log_path(meta["namespace"], meta["name"])
        log.parent.mkdir(parents=True, exist_ok=True)
        record = self._record(job)
        record.parent.mkdir(parents=True, exist_ok=True)
        for stale in paths(record)[1:]:  # a same-named run of a deleted program
            stale.unlink(missing_ok=True)
        wrapper = [sys.executable, "-m", "pathways_api.run_job", "--record", str(record)]
        wrapper += ["--uid", str(meta.get("uid") or ""), "--max-output", str(self.max_output)]
        wrapper += ["--grace", str(self.grace)]
        wrapper += ["--"]
        # A run started again after an interruption goes on in the same log.
        again = int((meta.get("annotations") or {}).get(INTERRUPTIONS) or 0)
        if not again:
            self._forget_old_outputs(meta["namespace"], meta["name"])
        with log.open("ab" if again else "wb") as output:
            if again:
                output.write(
                    f"--- interrupted (the embedded cluster stopped); started again "
                    f"({again}) ---\n".encode()
                )
                output.flush()
            popen = subprocess.Popen(
                [*wrapper, *command],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env={
                    **inherited_environment(os.environ),
                    "JAX_PLATFORMS": "cpu",
                    "PYTHONUNBUFFERED": "1",
                    **environment,
                },
                # Its own process group: killed with its children, and it outlives a manager
                # killed by SIGKILL (the next one adopts it). Not its own session: Linux shares
                # CPU equally between sessions, which would starve the islands it runs on.
                process_group=0,
            )
        deadline = job["spec"].get("activeDeadlineSeconds")
        now = time.monotonic()
        return Running(
            job, popen, now, now + deadline if deadline else None, record=record, pid=popen.pid
        )

    def _credentials(self, environment: Mapping[str, str]) -> str:
        """The run's session credentials for the islands of its slices that have a key."""
        signed = {}
        for grant in run_grants(environment, time.time()):
            credential = self.session_keys.sign(grant)
            if credential is not None:
                signed[grant.island] = credential
        return credentials_text(signed) if signed else ""

    def _checkpoint_dir(self, job: Document) -> Path | None:
        """The program's checkpoint directory: the same for all its runs, another for a
        program of the same name submitted again (it is named after the program's uid)."""
        meta = job["metadata"]
        owner = next(
            (o for o in meta.get("ownerReferences") or [] if o.get("kind") == "PathwaysProgram"),
            None,
        )
        if owner is None or not owner.get("uid"):
            return None
        return self.state / "checkpoints" / meta["namespace"] / owner["name"] / owner["uid"]

    def _poll_jobs(self) -> None:
        self._reap()
        for key, running in list(self.running.items()):
            if running.alive():
                if running.deadline is not None and time.monotonic() > running.deadline:
                    self._kill(running)
                    del self.running[key]
                    self._finishing.submit(self._finish, key, running, "DeadlineExceeded")
                continue
            del self.running[key]
            self._finishing.submit(self._finish, key, running)

    def _kill(self, running: Running) -> None:
        """Stop a run as a pod is stopped: SIGTERM (its wrapper passes it on, and kills what
        is left after the grace period); what is still there a few seconds after that is
        SIGKILLed by :meth:`_reap`. No run of its program starts until it is gone."""
        if running.kill_at is not None or not running.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(running.pid, signal.SIGTERM)
        running.kill_at = time.monotonic() + self.grace + KILL_MARGIN_SECONDS
        self.terminating.append(running)

    def _reap(self) -> None:
        """Forget stopped runs that are gone; SIGKILL those past their grace period (the
        wrapper's process group and the command's)."""
        for running in list(self.terminating):
            if not running.alive():
                self.terminating.remove(running)
                meta = running.job["metadata"]
                if running.record is not None and (meta["namespace"], meta["name"]) not in {
                    (r.job["metadata"]["namespace"], r.job["metadata"]["name"])
                    for r in self.running.values()
                }:
                    self._forget(meta["namespace"], meta["name"])
                # Its trace is kept as a finished run's (suspended, cancelled or moved, a run
                # of hours had none); one a previous manager was stopping left only its name.
                if "spec" in running.job:
                    self._finishing.submit(self._keep_trace, running)
                # A next run of its program waits for it to be gone (start_jobs): a round now
                # starts it (it waited until something else changed in the store).
                self._ended.set()
            elif time.monotonic() > (running.kill_at or 0):
                child = (
                    (read_json(paths(running.record)[1]) or {}).get("child")
                    if running.record
                    else None
                )
                for group in (running.pid, child):
                    if group:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(group, signal.SIGKILL)

    def _stopping(self, namespace: str | None, program: str | None) -> bool:
        """Whether a run of the program is still being stopped."""
        return any(
            (
                (r.job["metadata"].get("labels") or {}).get(LABEL_PROGRAM),
                r.job["metadata"]["namespace"],
            )
            == (program, namespace)
            for r in self.terminating
        )

    def _finish(self, key: str, running: Running, reason: str | None = None) -> None:
        """Keep the run's trace, then write the Job's outcome."""
        self._keep_trace(running)
        job = self.store.read(JOB, *key.split("/"))
        if job is None:
            return
        code = running.exit_code()
        if reason == "DeadlineExceeded":
            self._write_job(
                job,
                failed=True,
                message="the run exceeded activeDeadlineSeconds",
                reason="DeadlineExceeded",
            )
        elif code is None:
            self._write_job(job, failed=True, message=VANISHED)
        else:
            message = f"the driver exited with code {code}"
            if code != 0:
                message += self._last_words(job)
            self._write_job(job, failed=code != 0, message=message)
        self._ended.set()

    def _last_words(self, job: Document) -> str:
        """``: <the last line of the run's output>`` (usually the exception), or nothing."""
        meta = job["metadata"]
        try:
            with self.store.log_path(meta["namespace"], meta["name"]).open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 4096))
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        if not lines:
            return ""
        line = lines[-1].strip()
        if len(line) > LAST_WORDS_CHARS:  # its end says what went wrong: keep both ends
            half = LAST_WORDS_CHARS // 2
            line = f"{line[:half]} ... {line[-half:]}"
        return f": {printable(line)}"  # the program's bytes, shown: never a terminal's codes

    def _write_job(
        self, job: Document, *, failed: bool, message: str, reason: str = "BackoffLimitExceeded"
    ) -> None:
        status = {
            "startTime": (job.get("status") or {}).get("startTime"),
            "completionTime": now_text(),
        }
        if failed:
            status.update(
                failed=1,
                conditions=[
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": status["completionTime"],
                    }
                ],
            )
        else:
            status.update(
                succeeded=1,
                conditions=[{"type": "Complete", "status": "True", "message": "the run completed"}],
            )
        for _ in range(5):
            if self.store.write_status(job, prune(status)) is not None:
                self._forget(job["metadata"]["namespace"], job["metadata"]["name"])
                break
            job = self.store.read(JOB, job["metadata"]["namespace"], job["metadata"]["name"])
            if job is None:
                return
        # Wake the program: it is settled only in a terminal phase, so it is reconciled anyway.
        program = (job["metadata"].get("labels") or {}).get(LABEL_PROGRAM)
        if program:
            self.store.settle(PROGRAM, job["metadata"]["namespace"], program, False)

    def _keep_trace(self, running: Running) -> None:
        """:meth:`_collect_trace`, a failure logged (a trace is worth no failed run)."""
        name = running.job["metadata"]["name"]
        try:
            self._collect_trace(running)
        except TraceUnavailable as error:  # its island went down meanwhile, say
            logger.warning("could not collect the trace of %s: %s", name, error)
        except Exception:
            logger.warning("could not collect the trace of %s", name, exc_info=True)

    def _collect_trace(self, running: Running) -> None:
        """The island trace records of this run's client since the run started, kept in the
        store (every run of a program is the same client: the earlier runs' records are
        theirs)."""
        job = running.job
        container = job["spec"]["template"]["spec"]["containers"][0]
        environment = {item["name"]: item.get("value", "") for item in container.get("env", [])}
        # Whose run it is, from the Job itself (a driver's env cannot say it is another's).
        namespace = job["metadata"]["namespace"]
        name = (job["metadata"].get("labels") or {}).get(LABEL_PROGRAM)
        slices = json.loads(environment.get("PATHWAYS_SLICES") or "{}")
        if not name or not slices:
            return
        islands = {entry["island"]: entry["scheduler"] for entry in slices.values()}
        run = int((job["metadata"].get("labels") or {}).get("pathways.dev/run") or 0)
        owner = next(iter(job["metadata"].get("ownerReferences") or []), {}).get("uid")
        missing: dict[str, str] = {}  # islands whose records of the run are not there
        for island, endpoint in list(islands.items()):
            current = ((self.store.read(ISLAND, None, island) or {}).get("status") or {}).get(
                "schedulerEndpoint"
            )
            if current != endpoint:  # restarted (or down) since: that trace is gone
                del islands[island]
                missing[island] = "its scheduler restarted before the run's trace was taken"
        if not islands:
            self.store.store_trace(namespace, name, run, [], missing, owner)
            return
        arguments = [sys.executable, "-m", "pathways_client.trace_dump"]
        for island, endpoint in sorted(islands.items()):
            arguments += ["--island", f"{island}={endpoint}"]
        arguments += ["--client", island_client_name(f"{namespace}/{name}")]
        started = (
            (read_json(paths(running.record)[1]) or {}).get("started") if running.record else None
        )
        if isinstance(started, int | float):
            arguments += ["--since-ns", str(int(started * 1e9))]
        done = subprocess.run(
            arguments,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            check=False,
        )
        if done.returncode != 0:
            why = done.stderr.strip()[-2000:]
            unread = dict.fromkeys(islands, f"its trace could not be read: {why}")
            self.store.store_trace(namespace, name, run, [], {**missing, **unread}, owner)
            raise TraceUnavailable(why)
        dumped = json.loads(done.stdout)
        self.store.store_trace(
            namespace, name, run, dumped["records"], {**missing, **dumped["incomplete"]}, owner
        )


# What a run's process takes from the manager's environment, as a pod takes its node's
# basics: where programs and Python's packages are, the locale and temp folder, JAX's and
# XLA's settings, and the islands' TLS client identity. Nothing else (a token the manager had
# went to every tenant's driver); a driver's own variables are its spec.driver.env.
INHERITED = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"}
)
INHERITED_PREFIXES = ("LC_", "JAX_", "XLA_", "PATHWAYS_TLS_")


def inherited_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environment`` a run's process is started with (see INHERITED)."""
    return {
        name: value
        for name, value in environment.items()
        if name in INHERITED or name.startswith(INHERITED_PREFIXES)
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m pathways_api.manager --state DIR``."""
    parser = argparse.ArgumentParser(description="The embedded resource manager.")
    parser.add_argument("--state", type=Path, required=True, help="State directory.")
    parser.add_argument("--interval", type=float, default=0.1, help="Seconds between ticks.")
    parser.add_argument(
        "--max-output",
        type=int,
        default=os.environ.get("PATHWAYS_MAX_OUTPUT_BYTES", str(MAX_OUTPUT_BYTES)),
        help="Bytes of each run's output its log keeps (PATHWAYS_MAX_OUTPUT_BYTES; 1 GiB).",
    )
    parser.add_argument(
        "--exit-with-launcher",
        action="store_true",
        help="stop when standard input closes (the embedded supervisor holds its other end)",
    )
    arguments = parser.parse_args(argv)
    if arguments.max_output < 1:
        parser.error(
            f"--max-output (or PATHWAYS_MAX_OUTPUT_BYTES) must be >= 1, not {arguments.max_output}"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    arguments.state.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(arguments.state / "pathways.db")
    manager = Manager(
        store, arguments.state, interval=arguments.interval, max_output=arguments.max_output
    )
    signal.signal(signal.SIGTERM, lambda *_: manager._stop.set())
    if arguments.exit_with_launcher:
        stop_when_stdin_closes()
    print(json.dumps({"manager": os.getpid()}), flush=True)
    try:
        manager.run()
    finally:
        manager.stop()


if __name__ == "__main__":
    main()
