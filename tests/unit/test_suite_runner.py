"""scripts/test_suite.py (``make test``): the cluster tiers beside the others, one line of time over both, and
plain pytest whenever arguments are given."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test_suite.py"


def _module():
    spec = importlib.util.spec_from_file_location("test_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_time_by_tier_of_both_processes_is_summed_into_one_line():
    suite = _module()
    first = "...\ntime by tier: multiprocess 1522s, spark 309s, unit 201s; total 2032s\n=== 3 passed ===\n"
    second = "time by tier: hadoop 681s, multiprocess 290s, standalone 221s; total 1192s\n"
    assert suite.tier_seconds(first) == {"multiprocess": 1522, "spark": 309, "unit": 201}
    assert suite.tier_seconds("no such line") == {}
    line = suite.summary(first, second, 2301.4)
    # multiprocess ran in both processes: its two times add up
    assert line == ("time by tier (both processes): multiprocess 1812s, hadoop 681s, spark 309s, standalone 221s, "
                    "unit 201s; sum 3224s, wall clock 2301s")


def test_either_process_failing_fails_the_suite():
    suite = _module()
    assert suite.exit_code(0, 0) == 0 and suite.exit_code(0, 5) == 0
    assert suite.exit_code(1, 0) == 1 and suite.exit_code(0, 1) == 1 and suite.exit_code(0, 2) == 2
    assert suite.exit_code(5, 1) == 1


def test_the_cluster_tiers_are_tiers_that_exist_and_arguments_mean_plain_pytest(tmp_path):
    suite = _module()
    assert all((ROOT / tier).is_dir() for tier in suite.CLUSTER_TIERS)
    # what the second process takes must exist (a path that does not stops its pytest)
    assert all((ROOT / path).exists() for path in suite.SECOND) and set(suite.CLUSTER_TIERS) <= set(suite.SECOND)
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_one():\n    assert True\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(probe), "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 passed" in proc.stdout and "run beside" not in proc.stdout, proc.stdout
    failing = tmp_path / "test_failing.py"
    failing.write_text("def test_one():\n    assert False\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(failing), "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
