"""Every process's command line while a job runs, and the environment of the processes that matter: for checks
that a secret reaches a process without passing through a command line, which every user of the host can read."""
from __future__ import annotations

import os
import threading
from pathlib import Path


class ProcessWatcher(threading.Thread):
    """Polls /proc every 50 ms until :meth:`stop`: ``cmdlines`` holds every command line seen (arguments joined
    by spaces); ``matched`` maps the pid of each process whose command line holds ``marker`` to (its arguments,
    its environment as first seen)."""

    def __init__(self, marker: str) -> None:
        super().__init__(daemon=True)
        self.marker = marker
        self.cmdlines: set[str] = set()
        self.matched: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
                    line = " ".join(args)
                    if self.marker in line and pid not in self.matched:
                        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
                        self.matched[pid] = (args, dict(v.split("=", 1) for v in raw.split("\0") if "=" in v))
                except OSError:  # gone meanwhile
                    continue
                self.cmdlines.add(line)
            self._done.wait(0.05)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)
