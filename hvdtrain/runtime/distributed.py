"""Data-parallel collectives: the only module that imports Horovod.

Under a launcher (``horovodrun``, ``horovod.spark.run``, mpirun) this wraps
Horovod's TensorFlow ops; launched as plain ``python -m hvdtrain.training.train`` it
falls back to a single process and never imports Horovod, so laptops and unit
tests need no Horovod build.

hvdtrain's recipe: a plain ``tf.GradientTape`` followed by
:func:`allreduce_grads` (one ``hvd.grouped_allreduce(op=Average)``, or one
``hvd.allreduce`` per gradient as ``hvd.DistributedGradientTape`` does, which
the step needs separable from the tape for accumulation and timing), and
:func:`broadcast_state` (``hvd.broadcast_variables``) of model and optimizer
variables from rank 0 once the optimizer is built. State the ranks update
apart from the gradients (BatchNormalization's moving statistics) is brought
back together by :func:`average_variables` before it is evaluated, saved or
exported.

Every collective here must be called by every rank, in the same order.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from hvdtrain.core.errors import EnvironmentProblem

log = logging.getLogger(__name__)

# Environment variables a Horovod launcher sets in each worker process:
# horovodrun/horovod.spark with Gloo set HOROVOD_RANK; MPI launchers set the others.
LAUNCHER_ENV = ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    hostname: str
    backend: str  # "horovod" or "local"
    cross_rank: int = 0  # which host (in launcher order) this rank runs on

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


_hvd: Any = None  # horovod.tensorflow once init() chose Horovod
_info: Optional[RankInfo] = None


def launched_by_horovod(env: Mapping[str, str]) -> bool:
    """True when a Horovod/MPI launcher started this process (pure)."""
    return any(name in env for name in LAUNCHER_ENV)


def init(use_horovod: Optional[bool] = None) -> RankInfo:
    """Initialize once and return this process's rank info.

    Args:
        use_horovod: force Horovod on or off; by default Horovod is used only
            when a launcher's environment variables are present.
    """
    global _hvd, _info
    if _info is not None:
        return _info
    if use_horovod is None:
        use_horovod = launched_by_horovod(os.environ)
    if not use_horovod:
        _info = RankInfo(0, 1, 0, 1, socket.gethostname(), "local")
        return _info
    try:
        import horovod.tensorflow as hvd
    except ImportError as exc:
        raise EnvironmentProblem(
            f"this process was started by a Horovod launcher but horovod.tensorflow does not import ({exc}); "
            "build it with scripts/build_horovod.sh, then check with `horovodrun --check-build`") from exc
    hvd.init()
    _hvd = hvd
    _info = RankInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), socket.gethostname(), "horovod",
                     hvd.cross_rank())
    pin_gpu(_info.local_rank)
    return _info


ASSIGNED_GPUS_ENV = "HVDTRAIN_ASSIGNED_GPUS"  # set by yarn/executor.py from Spark's GPU assignment


def gpu_index(local_rank: int, env: Mapping[str, str]) -> int:
    """Which visible GPU this process uses (pure): the first when a resource manager
    (Spark on YARN) already narrowed CUDA_VISIBLE_DEVICES to this task's GPUs, else
    the one of its local rank."""
    return 0 if env.get(ASSIGNED_GPUS_ENV) else local_rank


def pin_gpu(local_rank: int) -> Optional[str]:
    """Make only this process's GPU visible (one GPU per process); None without GPUs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    local_rank = gpu_index(local_rank, os.environ)
    if local_rank >= len(gpus):
        raise EnvironmentProblem(f"local rank {local_rank} has no GPU: this host has {len(gpus)}; "
                                 "launch at most one process per GPU (horovodrun -H host:NUM_GPUS)")
    gpu = gpus[local_rank]
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, "GPU")
    return gpu.name


def info() -> RankInfo:
    if _info is None:
        raise RuntimeError("hvdtrain.runtime.distributed.init() must be called first")
    return _info


def _horovod() -> Any:
    """Horovod when the job runs on several processes, else None (single process: collectives are identities)."""
    return _hvd if _hvd is not None and _hvd.size() > 1 else None


# -- collectives ----------------------------------------------------------------

def allreduce_grads(grads: Sequence[Any], fp16: bool = False, grouped: bool = True,
                    sparse: Sequence[bool] = ()) -> list[Any]:
    """Average gradients over ranks (callable inside tf.function).

    ``grouped``: one ``hvd.grouped_allreduce`` of all gradients, which Horovod
    starts only once every one of them exists. Otherwise one ``hvd.allreduce``
    per gradient (what ``hvd.DistributedGradientTape`` does with no groups):
    inside a tf.function each op depends on its own gradient only, so the
    executor hands it to Horovod as soon as backprop produced that gradient,
    while the layers below are still being differentiated, and Horovod's
    tensor fusion batches whatever is ready each cycle.

    Sparse gradients (embedding lookups) are made dense first, as Horovod's
    ``sparse_as_dense=True`` does: one fused all-reduce instead of allgathers,
    except where ``sparse[i]`` is true: that gradient, when it is a
    ``tf.IndexedSlices``, travels as one (Horovod allgathers its rows and
    indices and divides by the world size), so a large embedding sends only the
    rows a step touched (:func:`hvdtrain.steps.sparse_choice` decides).
    With ``fp16`` the tensors travel as float16 (``hvd.Compression.fp16``,
    verified under Gloo for both forms) and come back in their own dtype;
    values beyond float16's range (65504) arrive as inf.
    """
    hvd = _horovod()
    if hvd is None:
        return list(grads)
    import tensorflow as tf

    keep = [i < len(sparse) and sparse[i] and isinstance(g, tf.IndexedSlices) for i, g in enumerate(grads)]
    if not any(keep):
        return _allreduce_dense(hvd, grads, fp16, grouped)
    gathered = {i: _sum_duplicates(hvd.allreduce(g, op=hvd.Average)) for i, g in enumerate(grads) if keep[i]}
    rest = _allreduce_dense(hvd, [g for i, g in enumerate(grads) if not keep[i]], fp16, grouped)
    return [gathered[i] if keep[i] else rest.pop(0) for i in range(len(grads))]


def _sum_duplicates(slices: Any) -> Any:
    """One row per index (the ranks' rows of a table summed), so an optimizer's per-row arithmetic (Adam's
    squared gradient) sees the same gradient as after a dense all-reduce."""
    import tensorflow as tf

    unique, position = tf.unique(slices.indices)
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, slices.dense_shape)


def _allreduce_dense(hvd: Any, grads: Sequence[Any], fp16: bool, grouped: bool) -> list[Any]:
    """:func:`allreduce_grads` of gradients sent dense (IndexedSlices densified first)."""
    import tensorflow as tf

    if not grads:
        return []
    dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    if grouped:
        return hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression)
    # tf.function runs stateful ops (Horovod's) in the order they were created, one after another. Backprop
    # produces the gradients of the last layers first, i.e. in about the reverse of the variables' order, so
    # create the all-reduces in that order: created in variable order, the first would wait for the whole
    # backward pass and hold up the rest behind it.
    reduced = [None if g is None else hvd.allreduce(g, op=hvd.Average, compression=compression)
               for g in reversed(dense)]
    return reduced[::-1]


def broadcast_state(model: Any, optimizer: Any, root_rank: int = 0) -> None:
    """Copy rank 0's model and optimizer variables to every rank.

    Build the optimizer first (``optimizer.build(model.trainable_variables)``)
    so its slot variables exist; Keras seed-generator states are not sent, so
    each rank keeps its own dropout randomness.
    """
    hvd = _horovod()
    if hvd is None:
        return
    if not optimizer.variables:
        raise RuntimeError("build the optimizer before broadcast_state(); its variables do not exist yet")
    # Horovod's broadcast runs in a tf.function that assigns to its arguments: hand it the
    # tf.Variable under each Keras 3 variable (a Keras variable would arrive as a plain tensor).
    hvd.broadcast_variables([_tf_variable(v) for v in model.weights], root_rank=root_rank)
    hvd.broadcast_variables([_tf_variable(v) for v in optimizer.variables], root_rank=root_rank)


def average_variables(variables: Sequence[Any], name: str = "hvdtrain.average") -> None:
    """Set each (floating-point) variable to its mean over ranks, in place (eager; every rank passes the same
    variables in the same order).

    For state each rank updates from its own batches, outside the gradients: BatchNormalization's moving mean
    and variance. One grouped all-reduce, summed in float64 and divided by the world size, so a value every
    rank holds comes back bit for bit (for float32 variables) and all ranks get the same bits.
    """
    hvd = _horovod()
    if hvd is None or not variables:
        return
    import tensorflow as tf

    sums = hvd.grouped_allreduce([tf.cast(_tf_variable(v), tf.float64) for v in variables], op=hvd.Sum, name=name)
    for variable, total in zip(variables, sums):
        variable.assign(tf.cast(total / float(hvd.size()), variable.dtype))


def _tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (TensorFlow backend); tf.Variables pass through."""
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(f"cannot broadcast {getattr(variable, 'path', variable)!r}: not backed by a tf.Variable "
                    "(is KERAS_BACKEND set to something other than tensorflow?)")


def allreduce_sum(value: Any, name: Optional[str] = None) -> np.ndarray:
    """Exact sum over ranks of a NumPy array (or tensor); same dtype back (eager only).

    Integer counts (confusion matrices) sum exactly; float64 keeps sums of
    losses and correct counts exact to 2**53, so means computed from the totals
    are true global means, not means of per-rank means.
    """
    arr = np.asarray(value)
    hvd = _horovod()
    if hvd is None:
        return arr.copy()
    import tensorflow as tf

    return hvd.allreduce(tf.constant(arr), op=hvd.Sum, name=name).numpy()


def allgather_object(obj: Any, name: Optional[str] = None) -> list[Any]:
    """Every rank's (small, picklable) object, in rank order, on every rank."""
    hvd = _horovod()
    if hvd is None:
        return [obj]
    return hvd.allgather_object(obj, name=name)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Rank ``root_rank``'s (picklable) object, on every rank."""
    hvd = _horovod()
    if hvd is None:
        return obj
    return hvd.broadcast_object(obj, root_rank=root_rank, name=name)


def barrier() -> None:
    """Wait until every rank gets here (an allreduce of one number)."""
    allreduce_sum(np.zeros(1, dtype=np.int32), name="hvdtrain.barrier")


# -- Horovod timeline ------------------------------------------------------------

TIMELINE_ENV = {"HOROVOD_TIMELINE": "DYNAMIC"}  # set before init(): lets start_timeline() record on demand


def start_timeline(path: str) -> bool:
    """Start recording Horovod's timeline (Chrome trace JSON, written by rank 0) to ``path``.

    Every rank calls it. Only rank 0 writes, and its call returns once the file
    is open; the other ranks then wait for rank 0 (an allgather, so no
    all-reduce enters the trace), or a rank running ahead would submit its
    first gradients before recording began and that step would be missing
    some of its tensors. Needs ``HOROVOD_TIMELINE=DYNAMIC``
    (:data:`TIMELINE_ENV`) in the environment before :func:`init`. False
    when there is nothing to record (a single process).
    """
    hvd = _horovod()
    if hvd is None:
        return False
    try:
        hvd.start_timeline(path, mark_cycles=False)
    except ValueError as exc:  # started without HOROVOD_TIMELINE=DYNAMIC
        raise EnvironmentProblem(f"train.timeline: Horovod cannot record a timeline ({exc}); set "
                                 "HOROVOD_TIMELINE=DYNAMIC before Horovod starts (hvdtrain.training.train does)") from exc
    hvd.allgather_object(None, name="hvdtrain.timeline_started")
    return True


def stop_timeline() -> None:
    """Stop recording and close the timeline file (every rank calls it)."""
    hvd = _horovod()
    if hvd is not None:
        hvd.stop_timeline()


# -- elastic mode ---------------------------------------------------------------

def elastic_state(model: Any, optimizer: Any, **counters: Any) -> Any:
    """Horovod's elastic state of a Keras model and optimizer plus plain ``counters`` (committed and restored
    together); needs :func:`init` under an elastic horovodrun."""
    if _hvd is None:
        raise EnvironmentProblem("train.elastic needs the ranks launched by an elastic horovodrun (hvdtrain train "
                                 "does so when train.elastic is set); this process was not")
    return _hvd.elastic.TensorFlowKerasState(model, optimizer, **counters)


def elastic_run(fn: Any) -> Any:
    """``hvd.elastic.run``: ``fn(state)`` re-run after each reset, the state rolled back to its last commit."""
    return _hvd.elastic.run(fn)


def refresh() -> RankInfo:
    """This process's rank info again, after an elastic reset changed the world."""
    global _info
    hvd = _hvd
    _info = RankInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), socket.gethostname(), "horovod",
                     hvd.cross_rank())
    return _info
