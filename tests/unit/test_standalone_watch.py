"""scripts/standalone_cluster.sh's owner watch: once the owner (the test session) is gone, the daemons go too."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "standalone_cluster.sh"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie (not yet reaped) is gone too


def test_the_watch_stops_the_daemons_once_their_owner_is_gone(tmp_path: Path) -> None:
    # Stand-ins for the master and workers: process-group leaders, as setsid makes the real daemons.
    daemons = {name: subprocess.Popen(["sleep", "300"], start_new_session=True) for name in ("master", "host-a")}
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    for name, proc in daemons.items():
        (tmp_path / f"{name}.pid").write_text(str(proc.pid))
    watch = subprocess.Popen(["bash", str(SCRIPT), "watch", str(owner.pid), str(tmp_path)])
    try:
        time.sleep(2)
        assert watch.poll() is None and all(_alive(p.pid) for p in daemons.values())  # the owner lives: all stay
        owner.kill()
        owner.wait()
        assert watch.wait(timeout=60) == 0
        for proc in daemons.values():
            proc.wait(timeout=30)
        assert not list(tmp_path.glob("*.pid"))
    finally:
        for proc in [*daemons.values(), owner, watch]:
            if proc.poll() is None:
                proc.kill()
