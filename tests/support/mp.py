"""Shared by the multiprocess and multihost tiers: finding horovodrun, and the one way to skip them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SKIP_ENV = "HVDTRAIN_SKIP_MULTIPROCESS"  # =1: skip the multiprocess and multihost tiers on purpose
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def horovodrun() -> Path:
    """horovodrun of this interpreter's environment; a missing one fails the test (never a silent skip)."""
    if not HOROVODRUN.exists():
        pytest.fail(f"horovodrun not found next to {sys.executable}: the multiprocess tier needs Horovod "
                    f"(make env builds it); set {SKIP_ENV}=1 to skip this tier on purpose")
    return HOROVODRUN


@dataclass(frozen=True)
class SshHosts:
    """A running throwaway sshd (scripts/test_sshd.sh) serving two "hosts" on this machine."""

    folder: Path
    port: int
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")

    @property
    def identity(self) -> Path:
        return self.folder / "id_ed25519"

    def host_tmp(self, host: str) -> Path:
        """The TMPDIR sessions on ``host`` get: that host's local disk."""
        return self.folder / f"host-{host}" / "tmp"

    def horovodrun_args(self) -> tuple[str, ...]:
        """horovodrun arguments: the sshd's port and key, and loopback for Gloo (no interface probing)."""
        return ("-p", str(self.port), "-i", str(self.identity), "--network-interfaces", "lo")

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the run's ssh first on PATH (its known hosts stay in the folder) and no TMPDIR
        (horovodrun would forward ours and override each host's own)."""
        env = {k: v for k, v in base.items() if k != "TMPDIR"}
        env["PATH"] = f"{self.folder / 'bin'}{os.pathsep}{base.get('PATH', '')}"
        return env

    def accepted_logins(self) -> list[str]:
        """Addresses that sshd accepted a key login on (one line per session)."""
        log = (self.folder / "sshd.log").read_text()
        return re.findall(r"Accepted publickey for root from \S+ port \d+ ssh2.*", log)


SSHD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_sshd.sh"


def cannot_start_sshd() -> str:
    """Why this machine cannot run the multihost tier ('' when it can)."""
    if os.geteuid() != 0:
        return f"multihost tier: starting a throwaway sshd needs root (uid {os.geteuid()}); CI runs it as root"
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd") or shutil.which("apt-get")):
        return "multihost tier: no sshd and no apt-get to install openssh-server"
    return ""


def start_sshd(folder: Path) -> SshHosts:
    proc = subprocess.run(["bash", str(SSHD_SCRIPT), "start", str(folder)], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"{SSHD_SCRIPT} start failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return SshHosts(folder, int(proc.stdout.strip().splitlines()[-1]))


def stop_sshd(folder: Path) -> None:
    subprocess.run(["bash", str(SSHD_SCRIPT), "stop", str(folder)], capture_output=True, timeout=60)
