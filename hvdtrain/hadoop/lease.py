"""One writer per shared output: a create-exclusive lease file, renewed while its holder runs.

A lease is a small JSON file (:data:`NAME` in the folder it guards) naming its holder: user, host, pid, when
it started and until when it holds (``expires``, pushed forward every ``ttl / 3`` while the holder runs). It
is created with :func:`hvdtrain.hadoop.fs.create_exclusive` (local: link(2); WebHDFS: CREATE with overwrite=false), so
of two writers exactly one gets it; the other is refused with one line naming the holder and what to do.

A lease is broken only when stale (:func:`is_stale`, pure): its holder's process is gone from this host (same
host and pid namespace: a rerun right after a crash or a kill proceeds), or it expired and, when the holder ran
on this host, its pid is gone. Breaking moves the file aside under a fresh name, checks it was the stale one, and deletes it;
a fresh lease taken in the meantime is put back. Releasing deletes the file only while it is still this
holder's (its token).
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional

from hvdtrain.core.errors import ANY_ERROR, DataError
from hvdtrain.hadoop import fs

log = logging.getLogger(__name__)

NAME = "_hvdtrain_lease.json"
TTL_SECONDS = 600.0  # a holder renews every third of it; a dead one's lease is stale after it


class LeaseHeld(DataError):
    """Another writer holds the output's lease (exit 3, like any refusal to touch data)."""


class LeaseLost(DataError):
    """This job's lease was broken or removed while it ran: it must not publish (exit 3)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, and until when (seconds since the epoch)."""

    what: str
    user: str
    host: str
    pid: int
    started: float
    expires: float
    token: str
    pidns: str = ""  # the holder's pid namespace (/proc/self/ns/pid); "" unknown: wait for the expiry


    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Optional["Holder"]:
        """The holder a lease file names; None when it is not one (half-written, or someone else's file)."""
        try:
            doc = json.loads(data)
            return cls(str(doc["what"]), str(doc["user"]), str(doc["host"]), int(doc["pid"]),
                       float(doc["started"]), float(doc["expires"]), str(doc["token"]), str(doc.get("pidns", "")))
        except (ValueError, KeyError, TypeError):
            return None


# -- policy (pure) --------------------------------------------------------------------------------------------

def is_stale(holder: Holder, now: float, host: str, pid_alive: Callable[[int], bool], pidns: str = "") -> bool:
    """Whether a lease may be broken: held in this ``host``'s pid namespace ``pidns`` by a process that is gone
    (at once: its pid can be seen from here); else expired and, when held on this host, its process gone.

    A pid means something only within its namespace: two containers on one NodeManager host share the host
    name, not their pids, so without a matching namespace only the expiry frees a lease."""
    here = holder.host == host
    if here and holder.pidns and holder.pidns == pidns and not pid_alive(holder.pid):
        return True
    if now < holder.expires:
        return False
    return not here or not pid_alive(holder.pid)


def pid_namespace() -> str:
    """This process's pid namespace, as Linux names it (``pid:[4026531836]``); "" where there is none."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds")


def refusal(holder: Holder, uri: str) -> str:
    """The one line a second writer gets (pure)."""
    return (f"{holder.what} is being written by {holder.user}@{holder.host} pid {holder.pid} since "
            f"{_when(holder.started)} (lease {uri}, held until {_when(holder.expires)} and renewed while it runs): "
            f"wait for that job to end, or, if that process is gone, remove {uri} and rerun")


def is_lease_file(rel: str) -> bool:
    """Whether a file name in a guarded folder is a lease's: the lease, the temporary file of its atomic renewal,
    or a broken stale lease moved aside (pure). Such files are the running job's, never a user's."""
    return rel == NAME or rel.startswith((NAME + ".tmp-", NAME + ".broken-"))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- acting ---------------------------------------------------------------------------------------------------

class Lease:
    """A held lease on ``uri`` (:func:`acquire` builds it); :meth:`renew` pushes its expiry, :meth:`release`
    ends it. A background thread renews it every ``ttl / 3`` until released."""

    def __init__(self, uri: str, holder: Holder, ttl: float, clock: Callable[[], float]):
        self.uri, self.holder, self.ttl, self._clock = uri, holder, ttl, clock
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="hvdtrain-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Push the expiry forward, unless the lease is no longer this holder's (then :attr:`lost`)."""
        current = _read(self.uri)
        if current is None or current.token != self.holder.token:
            if not self.lost:
                log.error("the lease %s is no longer this job's (%s): another writer broke it",
                          self.uri, "gone" if current is None else f"{current.user}@{current.host} pid {current.pid}")
            self.lost = True
            return
        self.holder = replace(self.holder, expires=self._clock() + self.ttl)
        fs.write_bytes_atomic(self.uri, self.holder.to_json())

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except ANY_ERROR as exc:  # the next try may reach the storage; the lease holds until it expires
                log.warning("could not renew the lease %s (%s: %s)", self.uri, type(exc).__name__, exc)

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is still this holder's: called right before publishing."""
        verify(self.uri, self.holder.token, self.holder.what)

    def release(self) -> None:
        """Stop renewing and delete the lease file while it is still this holder's."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            current = _read(self.uri)
            if current is not None and current.token == self.holder.token:
                fs.delete(self.uri)
        except ANY_ERROR as exc:  # the lease expires on its own
            log.warning("could not remove the lease %s (%s: %s); it expires by itself", self.uri,
                        type(exc).__name__, exc)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(folder: str, what: str, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.time,
            alive: Callable[[int], bool] = pid_alive, uri: Optional[str] = None) -> Lease:
    """Take the lease on ``folder`` (the file ``uri``, by default ``<folder>/_hvdtrain_lease.json``) for
    ``what`` (the output, as the refusal names it); raises :class:`LeaseHeld` when another writer holds it."""
    uri = uri or fs.join(folder, NAME)
    host, pidns = socket.gethostname(), pid_namespace()
    for _ in range(3):  # a lease released or broken meanwhile: try again
        now = clock()
        mine = Holder(what, _user(), host, os.getpid(), now, now + ttl, uuid.uuid4().hex, pidns)
        if fs.create_exclusive(uri, mine.to_json()):
            return Lease(uri, mine, ttl, clock)
        current = _read(uri)
        if current is None and not fs.exists(uri):
            continue
        if current is None:
            raise LeaseHeld(f"{what}: {uri} is there but is not a lease hvdtrain can read (being written, or "
                            f"another program's): wait a moment and rerun, or remove {uri} if no job writes there")
        if current.token == mine.token:  # created, but the answer was lost and a retry found it
            return Lease(uri, mine, ttl, clock)
        if not is_stale(current, clock(), host, alive, pidns):
            raise LeaseHeld(refusal(current, uri))
        _break(uri, current)
    raise LeaseHeld(f"{what}: the lease {uri} changed hands three times while this job tried to take it: "
                    "another writer is starting; wait for it, then rerun")


def verify(uri: str, token: str, what: str) -> None:
    """Raise :class:`LeaseLost` unless the lease file ``uri`` is still the one with ``token``: a job whose lease was
    broken (it could not renew it for a whole ``ttl``, e.g. through a storage outage, and another job took the
    output) or removed by hand must not publish over what the other writes."""
    current = _read(uri)
    if current is not None and current.token == token:
        return
    how = "removed" if current is None else f"taken by {current.user}@{current.host} pid {current.pid}"
    raise LeaseLost(f"{what}: this job's lease {uri} was {how} while it ran, so another job may be writing there; "
                    "nothing was published: make sure no other job writes there, then rerun")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid)
        return str(os.getuid())


def _read(uri: str) -> Optional[Holder]:
    try:
        return Holder.from_json(fs.read_bytes(uri))
    except FileNotFoundError:
        return None


def _break(uri: str, stale: Holder) -> None:
    """Move the stale lease aside and delete it; a fresh one that took its place meanwhile is put back."""
    aside = f"{uri}.broken-{uuid.uuid4().hex[:8]}"
    try:
        fs.move(uri, aside)
    except ANY_ERROR:
        if fs.exists(uri):
            raise
        return  # another writer broke it first
    moved = _read(aside)
    if moved is not None and moved.token != stale.token:  # not the one judged stale: a live holder's
        fs.create_exclusive(uri, moved.to_json())
    else:
        log.warning("broke the stale lease %s of %s@%s pid %d (held until %s; its process is gone)", uri,
                    stale.user, stale.host, stale.pid, _when(stale.expires))
    fs.delete(aside)
