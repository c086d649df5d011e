"""``make test``: every tier, in two pytest processes side by side.

The cluster tiers (``tests/hadoop``: Apache Hadoop's minicluster and its YARN jobs; ``tests/standalone``: a Spark
standalone cluster of two "hosts") spend most of their time waiting on JVMs: daemons starting, containers being
localized, applications being scheduled. Run one after the other with the rest, two cores stood half idle for a
quarter of the suite. Here they run in a second pytest beside the first (every other tier), whose output is the
terminal's; the second's goes to a log printed whole after the first ends. Both always run to the end; the exit
status is the first failure's, and one line sums the time by tier over both.

The second process also takes a few long runs of the others (SECOND_ALSO), so that the two end near the same time:
in the clean clone of 78c50d8 the cluster tiers ended after 1,314 s and the rest after 2,729 s. Everything that
needs the throwaway sshd on 127.0.0.2/3 (multihost, standalone) is in the second, one after the other.

Given any argument (``make test PYTEST_ARGS=...``), this is plain pytest with those arguments, in one process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

CLUSTER_TIERS = ("tests/hadoop", "tests/standalone")
# Their times in that clean clone (with the other process beside them): e2e 335 s, horovod_upstream 294 s,
# multihost 147 s. With those three, a clean clone of 2465ea6 ended the second after 2,040 s and the first after
# 2,458 s, so the sorted-table quality test (169 s there) moved too.
SECOND_ALSO = ("tests/e2e", "tests/multihost", "tests/multiprocess/test_horovod_upstream.py",
               "tests/multiprocess/test_quality_mp.py")
SECOND = CLUSTER_TIERS + SECOND_ALSO
TIER_LINE = re.compile(r"^time by tier: (.*); total \d+s$", re.M)


def tier_seconds(output: str) -> dict[str, int]:
    """The ``time by tier`` line of a pytest run (tests/conftest.py prints it), as {tier: seconds} (pure)."""
    match = TIER_LINE.search(output)
    if not match:
        return {}
    return {name: int(seconds[:-1]) for name, seconds in (part.rsplit(" ", 1) for part in match.group(1).split(", "))}


def summary(first: str, second: str, wall: float) -> str:
    """One line over both processes: each tier's time, their sum, and the wall-clock time (pure)."""
    tiers = tier_seconds(first)
    for tier, seconds in tier_seconds(second).items():  # a tier can run in both (multiprocess does)
        tiers[tier] = tiers.get(tier, 0) + seconds
    ranked = sorted(tiers.items(), key=lambda kv: -kv[1])
    return (f"time by tier (both processes): {', '.join(f'{t} {s}s' for t, s in ranked)}; "
            f"sum {sum(tiers.values())}s, wall clock {wall:.0f}s")


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if argv:
        return subprocess.call([*pytest, *argv])
    start = time.monotonic()
    with tempfile.NamedTemporaryFile("w+", prefix="hvdtrain-cluster-tiers-", suffix=".log", delete=False) as log:
        print(f"make test: {', '.join(SECOND)} run beside the rest; their output follows at the end ({log.name})",
              flush=True)
        # No cache plugin in the second: two processes would both write .pytest_cache.
        clusters = subprocess.Popen([*pytest, "-p", "no:cacheprovider", *SECOND], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        rest = subprocess.Popen([*pytest, *(f"--ignore={t}" for t in SECOND)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        seen = []
        assert rest.stdout is not None
        for line in rest.stdout:  # as it comes, and kept for the summary
            sys.stdout.write(line)
            sys.stdout.flush()
            seen.append(line)
        rest_code = rest.wait()
        cluster_code = clusters.wait()
        log.seek(0)
        cluster_output = log.read()
    os.unlink(log.name)
    sys.stdout.write(f"\n==== {', '.join(SECOND)} (run beside the tests above) ====\n{cluster_output}")
    print(summary("".join(seen), cluster_output, time.monotonic() - start), flush=True)
    return exit_code(rest_code, cluster_code)


def exit_code(*codes: int) -> int:
    """The suite's status from its processes' (pure): the first failure's; pytest's 5 (nothing collected: a
    ``-m`` that selects no cluster test) is not a failure."""
    failed = [c for c in codes if c not in (0, 5)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
