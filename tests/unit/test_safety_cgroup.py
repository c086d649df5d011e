"""The CPU budget reads this process's own cgroup and its parents, v1 and v2 (#28 item 15)."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hvdtrain.runtime import cpus

REPO = Path(__file__).resolve().parents[2]


def test_a_nested_cgroup_and_its_parents_are_read_v2_and_v1():
    v2 = {"/sys/fs/cgroup/cgroup.controllers": "cpu", "/sys/fs/cgroup/cpu.max": "max 100000",
          "/sys/fs/cgroup/yarn/cpu.max": "300000 100000", "/sys/fs/cgroup/yarn/c1/cpu.max": "max 100000"}
    assert cpus._quota(v2.get, "0::/yarn/c1\n") == 3.0  # the parent's limit applies to the child
    v1 = {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
          "/sys/fs/cgroup/cpu/pod/cpu.cfs_quota_us": "400000", "/sys/fs/cgroup/cpu/pod/cpu.cfs_period_us": "100000",
          "/sys/fs/cgroup/cpu/pod/ctr/cpu.cfs_quota_us": "150000",
          "/sys/fs/cgroup/cpu/pod/ctr/cpu.cfs_period_us": "100000"}
    assert cpus._quota(v1.get, "4:memory:/x\n2:cpu,cpuacct:/pod/ctr\n0::/\n") == 1.5


def _v1_cpu_root() -> Path:
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").exists() or not os.access(root, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu (root, not in a v2-only host)")
    return root


def test_a_real_nested_cgroup_quota_reaches_the_budget():
    """A process in child/ of parent/ (quota 1 CPU on the parent only) gets a 1-CPU budget."""
    parent = _v1_cpu_root() / f"hvdtrain-test-{uuid.uuid4().hex[:8]}"
    child = parent / "child"
    try:
        child.mkdir(parents=True)
        (parent / "cpu.cfs_period_us").write_text("100000")
        (parent / "cpu.cfs_quota_us").write_text("100000")
        code = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                "from hvdtrain.runtime import cpus; b = cpus.detect({}); print(b.cpus, b.source)")
        proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdin.readline()\n" + code,
                                 str(child / "cgroup.procs")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
        out, _ = proc.communicate("go\n", timeout=120)
        assert proc.returncode == 0 and out.split() == ["1", "cgroup", "quota"], out
    finally:
        for folder in (child, parent):
            if folder.exists():
                folder.rmdir()
