"""A rank's process set-up: logging, TensorFlow's threads and seeds, Horovod's environment, Kerberos."""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
from typing import Any, Callable, ContextManager, Iterator

import keras
import tensorflow as tf

from hvdtrain.core.config import FaultConfig, JobConfig, TrainConfig, YarnConfig
from hvdtrain.core.errors import DataError, EnvironmentProblem
from hvdtrain.hadoop import kerberos
from hvdtrain.observe import console
from hvdtrain.runtime import cpus, distributed
from hvdtrain.runtime import watchdog as watchdog_lib

log = logging.getLogger("hvdtrain.training.train")


def set_horovod_env(fault: FaultConfig, train: TrainConfig) -> None:
    """Horovod's fault timeouts (and the timeline's switch) for ``hvd.init()``; the user's environment wins."""
    for name, value in watchdog_lib.horovod_env(fault.peer_timeout, fault.stall_check_warning,
                                            fault.stall_timeout, fault.checkpoint_timeout).items():
        os.environ.setdefault(name, value)
    if train.timeline is not None:
        for name, value in distributed.TIMELINE_ENV.items():
            os.environ.setdefault(name, value)


CORRUPT_DATA = tf.errors.DataLossError  # TensorFlow's word for a record whose bytes fail their checksum


def skip_final_collections() -> None:
    """Once a rank's work is done: keep the interpreter's garbage collections at exit off its objects.

    Over a TensorFlow process's objects those collections took 1.5 s between ``main`` returning and the
    process ending (0.1 s with this), paid by every rank of every run, restart and trial. Objects are still
    freed by reference counting and atexit handlers (MLflow's, logging's, Horovod's shutdown) still run;
    only objects in reference cycles stay unfreed, as the process ends anyway."""
    gc.freeze()


def corrupt_data_error(exc: BaseException) -> DataError:
    """A corrupt shard as a DataError (exit 3) naming TensorFlow's first line and the fix."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DataError(f"a dataset shard is corrupt ({first}): its bytes changed after the ETL wrote them; "
                     "manifest.json records each shard's sha256 to find which; rerun the ETL to rewrite the dataset")


def kerberos_renewer(y: YarnConfig, rank: distributed.RankInfo) -> Any:
    """The first rank on each host keeps the host's Kerberos ticket alive from ``yarn.keytab`` (long jobs)."""
    if not (y.principal and y.keytab and rank.local_rank == 0) or os.environ.get("CONTAINER_ID"):
        return contextlib.nullcontext()  # in a YARN container Spark renews the job's tokens from --keytab
    problem = kerberos.renewal_problem(y.keytab, rank.hostname)
    if problem:
        raise EnvironmentProblem(problem)
    return kerberos.Renewer(y.principal, y.keytab)


Guard = Callable[[JobConfig, distributed.RankInfo], ContextManager[Any]]


@contextlib.contextmanager
def guarded(cfg: JobConfig, rank: distributed.RankInfo,
            watchdog: Callable[[float, int], Any] = watchdog_lib.Watchdog,
            renewer: Callable[[YarnConfig, distributed.RankInfo], ContextManager[Any]] = kerberos_renewer,
            ) -> Iterator[Any]:
    """What every training path (fixed-size and elastic) runs under: the stall watchdog (yields it: its ``phase``
    tells it what the rank does next) and, on the first rank of each host, the Kerberos renewer.

    Reads cfg.fault (the stall timeout) and cfg.yarn (the principal and keytab).
    """
    with watchdog(cfg.fault.stall_timeout, rank.rank) as dog, renewer(cfg.yarn, rank):
        yield dog


def configure_logging(rank: distributed.RankInfo) -> None:
    """Plain lines from rank 0; other ranks report warnings and errors only."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank.rank}] %(levelname)s %(message)s",
                            datefmt="%H:%M:%S")
    logging.getLogger("hvdtrain").setLevel(logging.INFO if rank.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # e.g. "Assets written to" on export


def configure_tf(rank: distributed.RankInfo, train: TrainConfig) -> int:
    """Size TensorFlow's thread pools from this rank's CPU budget, seed each rank differently (weights come
    from rank 0), and turn on op determinism when asked; returns the budget (tf.data's private pool too)."""
    found = cpus.detect()
    threads = cpus.per_rank(found, rank.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
    except RuntimeError:  # TensorFlow already started (run() called twice in one process)
        pass
    log.info("CPU budget %d for this rank (%s: %d%s); TensorFlow intra-op threads %d, inter-op %d, tf.data "
             "private pool %d", threads, found.source, found.cpus,
             f" shared by {rank.local_size} ranks on this host" if found.shared and rank.local_size > 1 else "",
             tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads(), threads)
    keras.utils.set_random_seed(train.seed + rank.rank)
    if train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return threads


def report_result(result: dict[str, Any]) -> None:
    """Rank 0's last word: the result as an event for the hvdtrain launcher (which prints the summary, or the
    JSON with --json), or as JSON on stdout when the rank runs under a plain horovodrun."""
    if not distributed.info().is_chief:
        return
    if console.launcher_mode():
        console.emit("result", result=result)
    else:
        print(json.dumps(result, indent=2))
