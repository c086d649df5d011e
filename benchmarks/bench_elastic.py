"""Elastic recovery against a full relaunch (``make bench`` group ``elastic``; full runs only).

- ``elastic_recovery_s``: benchmarks/elastic_drill.py, 20 losses (alternately a SIGKILLed rank and a whole host
  leaving discovery) in one elastic job of 4 ranks on two local hosts of 2 slots: seconds from each kill until
  a survivor reads its first batch of a lost virtual rank (median; max, hangs and records lost in the notes;
  target: median at most 5 s). A lost rank takes its host's other rank with it (Horovod blacklists the host).
  Baseline, in the same run: benchmarks/kill_drill.py, the same kind of job under ``--max-restarts`` with 5 rank
  kills, each followed by a full relaunch (seconds from the kill to the relaunched job's first step).
- ``elastic_goodput``: the drill job's wall time without a loss over its wall time under the 20 losses (target
  at least 0.9).

The two hosts are ``localhost`` and ``127.0.0.1`` on one 2-core machine: no second physical host exists here.
At 4 ranks a survivor need not be connected to the dead rank in the running collective; the project's Horovod
patch 0007 (a failed Gloo collective closes every connection of its rank) makes the failure reach every rank at
once, where before it waited for the Gloo timeout (120 s); benchmarks/README.md has both figures.
"""
from __future__ import annotations

import statistics
import tempfile

from benchmarks import elastic_drill, kill_drill
from benchmarks.common import Entry

KILLS, RELAUNCH_KILLS = 20, 5
RANKS = 4  # on elastic_drill.HOSTS, RANKS // 2 slots each


def run(quick: bool, extra: dict) -> list[Entry]:
    kills = 2 if quick else KILLS
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as workdir:
        elastic = elastic_drill.drill(workdir, kills=kills, seed=0, log=lambda m: print(f"[bench] {m}", flush=True),
                                      ranks=RANKS)
    with tempfile.TemporaryDirectory(prefix="bench-relaunch-") as workdir:
        relaunch = kill_drill.drill_run(workdir, kills=1 if quick else RELAUNCH_KILLS, seed=0,
                                        log=lambda m: print(f"[bench] {m}", flush=True),
                                        launch=kill_drill.Launch(np=RANKS, hosts=f"localhost:{RANKS}"))
    recovery = elastic.recovery()
    regrown = [loss.regrown_s for loss in elastic.losses if loss.regrown_s is not None]
    extra["elastic_drill"] = elastic.to_dict()
    notes = {"losses": len(elastic.losses), "hangs": elastic.hangs, "failed": elastic.failed, "error": elastic.error,
             "records_lost": elastic.records_lost, "same_batches": elastic.same_batches,
             "exit_code": elastic.exit_code, "max_s": recovery.get("max"), "target_median_s": 5.0,
             "median_met": bool(recovery) and recovery["median"] <= 5.0,
             "regrown_median_s": statistics.median(regrown) if regrown else None,
             "steps_repeated_max": max((loss.repeated_steps for loss in elastic.losses), default=None),
             "relaunch_max_s": relaunch.seconds_to_resumed_step["max"], "relaunch_kills": len(relaunch.kills),
             "sizes": elastic.sizes, "ranks": RANKS, "hosts": list(elastic_drill.HOSTS)}
    return [
        Entry("elastic_recovery_s", recovery.get("median", float("nan")), "s",
              "full relaunch under --max-restarts (kill drill, same run)", relaunch.seconds_to_resumed_step["median"],
              None, lower_is_better=True, notes=notes),
        Entry("elastic_goodput", elastic.goodput, "", "the same job with no loss", 1.0, 0.9,
              notes={"drill_s": round(elastic.drill_s, 1), "uninterrupted_s": round(elastic.uninterrupted_s, 1),
                     "losses": len(elastic.losses)}),
    ]
