"""The stall watchdog: fires on no progress, stays quiet while beats come, names rank and phase."""
import re
import subprocess
import sys
import threading
import time

from hvdtrain.runtime import watchdog


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_check_names_rank_and_phase_only_after_the_timeout():
    clock = FakeClock()
    dog = watchdog.Watchdog(timeout=60, rank=3, clock=clock)
    dog.phase("waiting for input batch")
    clock.now = 59
    assert dog.check() is None
    clock.now = 61
    assert dog.check().startswith("rank 3: no progress for 61s while waiting for input batch")
    dog.beat()
    assert dog.check() is None


def test_a_checkpoint_phase_has_its_own_limit_until_the_next_phase():
    clock = FakeClock()
    dog = watchdog.Watchdog(timeout=60, rank=0, clock=clock)
    dog.phase("publishing the last checkpoint", timeout=1800)
    clock.now = 1000
    assert dog.check() is None  # a slow HDFS publish is not a stall
    clock.now = 1801
    assert "no progress for 1801s while publishing the last checkpoint" in dog.check()
    dog.phase("waiting for input batches of step 9")  # back to the stall timeout
    clock.now = 1801 + 61
    assert "while waiting for input batches of step 9" in dog.check()


def test_thread_fires_once_on_a_real_stall_and_not_while_beating():
    fired = []
    done = threading.Event()

    def on_stall(msg):
        fired.append(msg)
        done.set()

    with watchdog.Watchdog(timeout=0.3, rank=0, on_stall=on_stall, poll=0.05) as dog:
        for _ in range(10):  # 0.5 s of steady progress: no alarm
            time.sleep(0.05)
            dog.beat()
        assert fired == []
        dog.phase("all-reduce of step 12")
        assert done.wait(5)
    assert len(fired) == 1 and "while all-reduce of step 12" in fired[0]


def test_a_stalled_process_dumps_stacks_and_exits_nonzero():
    code = ("import time, logging; from hvdtrain.runtime import watchdog\n"
            "with watchdog.Watchdog(timeout=0.5, rank=1, poll=0.1) as d:\n"
            "    d.phase('waiting for input batch')\n"
            "    time.sleep(30)\n")
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == watchdog.EXIT_STALLED
    assert time.time() - start < 20
    assert "rank 1: no progress for" in proc.stderr and "waiting for input batch" in proc.stderr
    # faulthandler's dump of every thread, on stderr, before the message: the stuck main thread's frame
    # (line 4 of the script: the sleep) and the watchdog thread that wrote it
    dump = proc.stderr[:proc.stderr.index("rank 1: no progress for")]
    assert re.search(r'Thread 0x[0-9a-f]+ \(most recent call first\):\n  File "<string>", line 4 in <module>', dump), \
        proc.stderr
    assert re.search(r"Current thread 0x[0-9a-f]+ \(most recent call first\):\n  File .*watchdog\.py", dump)
    assert proc.stdout == ""


def test_horovod_env_bounds_peer_waits():
    env = watchdog.horovod_env(peer_timeout=60, stall_check_warning=30, stall_timeout=300)
    assert env == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
                   "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "330"}
    # ranks waiting while rank 0 publishes a checkpoint must outlast Horovod's own stall shutdown
    assert watchdog.horovod_env(60, 30, 300, checkpoint_timeout=1800)["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "1830"
