"""Kerberos tickets for long jobs: how long the current one lasts, and renewing it from a keytab.

A ticket lives about 10 hours on most clusters; a week-long ``horovodrun``
job on cluster hosts outlives it, and its next HDFS call fails. With
``--principal`` / ``--keytab`` (``yarn.principal`` / ``yarn.keytab``) the
first rank on each host runs a :class:`Renewer`: it looks at the ticket with
``klist`` and, when less than a third of its lifetime (at most an hour) is
left, gets a new one with ``kinit -kt KEYTAB PRINCIPAL`` into the same
credential cache, which every rank on that host reads. (On YARN, Spark renews
delegation tokens itself from the ``--principal``/``--keytab`` it is given.)

:func:`parse_klist` and :func:`renew_due` are pure; the rest runs the tools.
"""
from __future__ import annotations

import datetime
import logging
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from hvdtrain.core.errors import ANY_ERROR

log = logging.getLogger("hvdtrain.hadoop.kerberos")

# MIT klist prints dates in the locale's short format; these are the common ones (C/POSIX locale first).
DATE_FORMATS = ("%m/%d/%y %H:%M:%S", "%m/%d/%Y %H:%M:%S", "%d/%m/%y %H:%M:%S", "%d/%m/%Y %H:%M:%S",
                "%Y-%m-%d %H:%M:%S", "%d.%m.%Y %H:%M:%S", "%b %d %H:%M:%S %Y")
_TGT = re.compile(r"^\s*(?P<start>.+?)\s{2,}(?P<expires>.+?)\s{2,}krbtgt/", re.MULTILINE)
_PRINCIPAL = re.compile(r"Default principal:\s*(\S+)")


@dataclass(frozen=True)
class Ticket:
    principal: Optional[str]
    starts: datetime.datetime
    expires: datetime.datetime

    def remaining(self, now: datetime.datetime) -> datetime.timedelta:
        return self.expires - now


def _date(text: str) -> Optional[datetime.datetime]:
    for fmt in DATE_FORMATS:
        try:
            return datetime.datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
    return None


def parse_klist(output: str) -> Optional[Ticket]:
    """The ticket-granting ticket in ``klist`` output, or None when there is none (pure)."""
    found = _TGT.search(output)
    if not found:
        return None
    starts, expires = _date(found.group("start")), _date(found.group("expires"))
    if starts is None or expires is None:
        return None
    principal = _PRINCIPAL.search(output)
    return Ticket(principal.group(1) if principal else None, starts, expires)


def renew_due(ticket: Optional[Ticket], now: datetime.datetime,
              margin: datetime.timedelta = datetime.timedelta(hours=1)) -> bool:
    """Renew when there is no ticket, or less than a third of its lifetime (at most ``margin``) is left (pure)."""
    if ticket is None:
        return True
    lifetime = ticket.expires - ticket.starts
    return ticket.remaining(now) <= min(margin, lifetime / 3)


def check_interval(ticket: Optional[Ticket], every: float) -> float:
    """Seconds until the renewer looks again (pure): ``every``, or a sixth of a shorter ticket's lifetime, so that
    the renewal window (its last third) is never stepped over; at least 5 s. With no ticket, ``every``."""
    if ticket is None:
        return every
    return max(5.0, min(every, (ticket.expires - ticket.starts).total_seconds() / 6))


def describe(ticket: Optional[Ticket], now: datetime.datetime) -> str:
    """``ml@EXAMPLE.COM, expires in 7h 12m`` (pure)."""
    if ticket is None:
        return "no ticket"
    left = int(ticket.remaining(now).total_seconds())
    who = ticket.principal or "unknown principal"
    if left <= 0:
        return f"{who}, expired {ticket.expires:%Y-%m-%d %H:%M}"
    return f"{who}, expires in {left // 3600}h {left % 3600 // 60:02d}m ({ticket.expires:%Y-%m-%d %H:%M})"


Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)


def current(run: Run = _run) -> Optional[Ticket]:
    """The ticket in the default credential cache (``klist``), or None."""
    try:
        out = run(["klist"])
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_klist(out.stdout) if out.returncode == 0 else None


def renewal_problem(keytab: str, host: str, which: Callable[[str], Optional[str]] = shutil.which,
                    is_file: Callable[[str], bool] = os.path.isfile) -> Optional[str]:
    """None when this host can renew the ticket from ``keytab``, else one line saying why not (pure given probes):
    a job that cannot renew would lose its ticket silently days later."""
    if not is_file(keytab):
        return (f"yarn.keytab {keytab} is not a file on {host}: the ticket could not be renewed here and would "
                "expire mid-run; ship the keytab to every host (spark-submit --keytab does on YARN) or fix the path")
    if which("kinit") is None:
        return (f"kinit is not on PATH on {host}: the Kerberos ticket from yarn.keytab could not be renewed; "
                "install the Kerberos client (krb5-user) or drop yarn.principal/yarn.keytab")
    return None


class Renewer:
    """A background thread that keeps a ticket alive from a keytab; use as a context manager."""

    def __init__(self, principal: str, keytab: str, run: Run = _run, every: float = 300.0,
                 now: Callable[[], datetime.datetime] = datetime.datetime.now):
        self.principal, self.keytab, self._run, self._every, self._now = principal, keytab, run, every, now
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._ticket: Optional[Ticket] = None  # as last seen: a short ticket makes the checks closer
        self.renewals = 0

    def check(self) -> None:
        """Renew now if due; a failed kinit is a warning (the next check tries again)."""
        ticket = self._ticket = current(self._run)
        if not renew_due(ticket, self._now()):
            return
        out = self._run(["kinit", "-kt", self.keytab, self.principal])
        if out.returncode == 0:
            self.renewals += 1
            self._ticket = current(self._run)
            log.info("Kerberos ticket renewed from %s: %s", self.keytab, describe(self._ticket, self._now()))
        else:
            log.warning("kinit -kt %s %s failed (%s); the ticket (%s) is not renewed, retrying in %.0fs",
                        self.keytab, self.principal, (out.stderr or out.stdout).strip()[:200],
                        describe(ticket, self._now()), self.next_check())

    def next_check(self) -> float:
        """Seconds until the next look at the ticket."""
        return check_interval(self._ticket, self._every)

    def _loop(self) -> None:
        while not self._stop.wait(self.next_check()):
            try:
                self.check()
            except ANY_ERROR as exc:  # renewal must never break training
                log.warning("Kerberos renewal check failed: %s", exc)

    def __enter__(self) -> "Renewer":
        self.check()
        self._thread = threading.Thread(target=self._loop, name="hvdtrain-kinit", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
