"""Compiled training and evaluation steps.

One optimizer step on every rank: forward and backward with a plain
``tf.GradientTape``, an all-reduce of the gradients (averaged over ranks;
optionally sent as float16; one grouped all-reduce after the backward pass, or
one per gradient overlapping it: :class:`Reduction`), then ``optimizer.apply``. Clipping by
global norm is the optimizer's ``global_clipnorm``, applied inside ``apply``,
i.e. after the all-reduce (every rank clips the same averaged gradients the
same way) and, under float16 loss scaling, after unscaling.

The loss is Keras's: the task's batch-mean loss (:mod:`hvdtrain.model.heads`) plus
``model.losses`` (kernel regularizers, ``add_loss``), as ``model.fit`` has it. A batch
with a ``weight`` feature (``source.weight_column``) weighs each example's loss, and the
batch mean is ``mean(w * loss)``, as ``model.fit`` with ``sample_weight`` has it.

Gradient accumulation (``k > 1``): each of the k micro-batches adds its
gradients into non-trainable accumulators with no communication; the k-th
call averages them (``sum / k``), all-reduces once and applies. All
micro-batches have the same size (training batches drop the remainder), so
the update equals one step on a batch of ``batch_size * k * ranks`` examples.

Mixed precision: the loss is computed in float32 from float32 logits (the
logits layer is float32, see :mod:`hvdtrain.model.models`); ``optimizer.scale_loss``
is the identity for a plain optimizer and multiplies by the dynamic scale for
``keras.optimizers.LossScaleOptimizer`` (float16), whose ``apply`` unscales,
skips non-finite steps and adapts the scale. The finiteness check runs on the
all-reduced gradients, so every rank skips the same steps. A skipped step does
not advance the optimizer's step counter, so the learning-rate schedule waits
for it too (the first few float16 steps are usually skipped while the scale
comes down from 2**15).

Float16 on the wire (``train.fp16_allreduce``) without loss scaling: a
gradient beyond float16's range arrives as inf. A :class:`FiniteGuard` then
skips the update: the check runs on the all-reduced gradients, which are the
same on every rank, so every rank skips the same step, and NaN never reaches
the weights. Skipped steps are counted (:meth:`FiniteGuard.count`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

import keras
import tensorflow as tf

from hvdtrain.data.contract import WEIGHT_FEATURE
from hvdtrain.model.heads import Head
from hvdtrain.runtime import distributed

Batch = dict[str, tf.Tensor]
Allreduce = Callable[[Sequence[Any]], list[Any]]
# One optimizer step over k micro-batches -> (this rank's sum of per-example losses, correct predictions).
OptimizerStep = Callable[[Sequence[Batch]], tuple[tf.Tensor, tf.Tensor]]


AllreduceMode = Literal["grouped", "overlap"]


@dataclass(frozen=True)
class Reduction:
    """How the step averages gradients over ranks (``train.allreduce``, ``train.fp16_allreduce``).

    ``grouped``: one grouped all-reduce once the whole backward pass is done.
    ``overlap``: one all-reduce per gradient in the same compiled step as the
    backward pass, so each starts as soon as its gradient exists and the
    transfer of the top layers' gradients overlaps backprop through the lower
    ones (Horovod's tensor fusion batches what is ready). The arithmetic is
    the same either way. With accumulation (``k > 1``) and in :class:`TimedStep`
    the all-reduce runs in its own compiled call after the gradients are
    complete, so ``overlap`` there only changes how the tensors are grouped.
    """

    fp16: bool = False
    mode: AllreduceMode = "grouped"
    sparse: tuple[bool, ...] = ()  # per trainable variable: send its IndexedSlices gradient sparse (sparse_choice)
    head: Head = Head()  # the task's loss whose gradients these are (hvdtrain.model.heads)

    def __call__(self, grads: Sequence[Any]) -> list[Any]:
        return distributed.allreduce_grads(grads, fp16=self.fp16, grouped=self.mode == "grouped", sparse=self.sparse)


def sparse_choice(shapes: Sequence[Sequence[int]], min_rows: int) -> tuple[bool, ...]:
    """Which variables send sparse gradients (pure): tables of at least ``min_rows`` rows (0: none).

    An embedding lookup's gradient holds only the rows a batch touched. All-
    gathering those (rows x width x ranks values, plus indices) beats all-
    reducing the whole table when the table is much larger than the rows a
    step touches: a 1M-row table against a few thousand lookups per step. A
    small table is cheaper densified, in the one fused all-reduce. A variable
    whose gradient turns out dense is all-reduced densely whatever this says.
    """
    return tuple(min_rows > 0 and len(shape) == 2 and shape[0] >= min_rows for shape in shapes)


def input_names(model: keras.Model) -> tuple[str, ...]:
    """The features the model reads (a custom model may read only some of the contract's)."""
    return tuple(t.name for t in model.inputs)


def sparse_variables(model: keras.Model, min_rows: int) -> tuple[bool, ...]:
    """:func:`sparse_choice` over the model's trainable variables."""
    return sparse_choice([tuple(v.shape) for v in model.trainable_variables], min_rows)


def _head(allreduce: Any) -> Head:
    """The task head travelling with a :class:`Reduction` (a plain all-reduce callable: multiclass)."""
    return getattr(allreduce, "head", Head())


def model_penalty(model: keras.Model) -> tf.Tensor:
    """The sum of ``model.losses`` (weight regularizers, ``add_loss``) as float32; read after the forward pass."""
    losses = [tf.reduce_sum(tf.cast(loss, tf.float32)) for loss in model.losses]  # summed, as Keras sums them
    return tf.add_n(losses) if losses else tf.constant(0.0, tf.float32)


def _gradients(model: keras.Model, optimizer: keras.optimizers.Optimizer, head: Head,
               batch: Batch, inputs: Sequence[str], label_feature: str) -> tuple[list[Any], tf.Tensor, tf.Tensor]:
    """This rank's (loss-scaled) gradients of the objective, its sum over the batch and the correct count.

    The objective is Keras's: the batch-mean loss plus :func:`model_penalty` (added once per batch, as
    ``model.fit`` adds it). The penalty is the same on every rank, so averaging over ranks and over
    accumulated micro-batches keeps it once per optimizer step. The sum returned counts it once per
    example, so the epoch's loss (sum / records) is the objective ``model.fit`` reports.
    """
    labels = batch[label_feature]
    with tf.GradientTape() as tape:
        logits = model({k: batch[k] for k in inputs}, training=True)
        per_example = head.loss(labels, logits, batch.get(WEIGHT_FEATURE)) + model_penalty(model)
        scaled = optimizer.scale_loss(tf.reduce_mean(per_example))
    grads = tape.gradient(scaled, model.trainable_variables)
    return grads, tf.reduce_sum(tf.cast(per_example, tf.float64)), head.correct(labels, logits)


class FiniteGuard:
    """Applies all-reduced gradients only when every value is finite; counts the steps it skipped."""

    def __init__(self) -> None:
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")

    def apply(self, optimizer: keras.optimizers.Optimizer, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        """Inside a tf.function: ``optimizer.apply`` or, on inf/NaN anywhere, count a skip instead."""
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])

        def update() -> tf.Tensor:
            optimizer.apply(grads, variables)
            return tf.constant(True)

        def skip() -> tf.Tensor:
            self.skipped.assign_add(1)
            return tf.constant(False)

        tf.cond(finite, update, skip)

    def count(self) -> int:
        """Optimizer steps skipped so far in this process."""
        return int(self.skipped.numpy())


def _apply(optimizer: keras.optimizers.Optimizer, grads: Sequence[Any], variables: Sequence[Any],
           guard: Optional[FiniteGuard]) -> None:
    if guard is None:
        optimizer.apply(grads, variables)
    else:
        guard.apply(optimizer, grads, variables)


def train_step_body(model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                    inputs: Optional[Sequence[str]] = None, allreduce: Allreduce = distributed.allreduce_grads,
                    guard: Optional[FiniteGuard] = None) -> Callable[[Batch], tuple[tf.Tensor, tf.Tensor]]:
    """One optimizer step on one batch, to be traced (uncompiled): gradients, one all-reduce, update;
    returns (loss sum, correct)."""
    names = tuple(inputs) if inputs is not None else input_names(model)
    head = _head(allreduce)

    def train_step(batch: Batch) -> tuple[tf.Tensor, tf.Tensor]:
        grads, loss_sum, correct = _gradients(model, optimizer, head, batch, names, label_feature)
        _apply(optimizer, allreduce(grads), model.trainable_variables, guard)
        return loss_sum, correct

    return train_step


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                    inputs: Optional[Sequence[str]] = None, allreduce: Allreduce = distributed.allreduce_grads,
                    guard: Optional[FiniteGuard] = None) -> Callable[[Batch], tuple[tf.Tensor, tf.Tensor]]:
    """A compiled step on one batch: gradients, one all-reduce, update; returns (loss sum, correct)."""
    return tf.function(train_step_body(model, optimizer, label_feature, inputs, allreduce, guard), autograph=False)


def make_multi_step(body: Callable[[Sequence[Batch]], tuple[tf.Tensor, tf.Tensor]],
                    accum_steps: int) -> Callable[[Sequence[Batch]], tuple[tf.Tensor, tf.Tensor]]:
    """Several optimizer steps in one compiled call (Keras's ``steps_per_execution``; ``train.steps_per_call``).

    Takes the batches of n steps (n x ``accum_steps``) and returns the per-step loss sums and correct counts
    as vectors of length n, unread. The steps are unrolled in the graph, each step's ops exactly those of
    one step per call, in the same order (automatic control dependencies keep step i's update before step
    i+1 reads the weights); each n is traced once.
    """
    @tf.function(autograph=False)
    def multi_step(batches: Sequence[Batch]) -> tuple[tf.Tensor, tf.Tensor]:
        if len(batches) % accum_steps:
            raise ValueError(f"a call takes whole optimizer steps of {accum_steps} batches (got {len(batches)})")
        outs = [body(batches[i:i + accum_steps]) for i in range(0, len(batches), accum_steps)]
        return tf.stack([o[0] for o in outs]), tf.stack([o[1] for o in outs])

    return multi_step


class AccumulatingStep:
    """k micro-batches per optimizer step, one all-reduce per step (see the module docstring)."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                 accum_steps: int, inputs: Optional[Sequence[str]] = None,
                 allreduce: Allreduce = distributed.allreduce_grads, guard: Optional[FiniteGuard] = None):
        if accum_steps < 1:
            raise ValueError(f"train.grad_accum_steps must be >= 1 (got {accum_steps})")
        self.accum_steps = accum_steps
        self._model, self._optimizer, self._allreduce, self._guard = model, optimizer, allreduce, guard
        self._names = tuple(inputs) if inputs is not None else input_names(model)
        self._label, self._head = label_feature, _head(allreduce)
        self._sums = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False, name="grad_accum")
                      for v in model.trainable_variables]
        self._micro = tf.function(self._micro_step, autograph=False)
        self._apply = tf.function(self._apply_step, autograph=False)

    def _micro_step(self, batch: Batch) -> tuple[tf.Tensor, tf.Tensor]:
        grads, loss_sum, correct = _gradients(self._model, self._optimizer, self._head, batch, self._names,
                                              self._label)
        for total, grad in zip(self._sums, grads):
            if grad is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        return loss_sum, correct

    def _apply_step(self) -> None:
        mean = [total / float(self.accum_steps) for total in self._sums]
        _apply(self._optimizer, self._allreduce(mean), self._model.trainable_variables, self._guard)
        for total in self._sums:
            total.assign(tf.zeros_like(total))

    def __call__(self, batches: Sequence[Batch]) -> tuple[tf.Tensor, tf.Tensor]:
        if len(batches) != self.accum_steps:
            raise ValueError(f"an optimizer step takes {self.accum_steps} micro-batches (got {len(batches)})")
        outs = [self._micro(batch) for batch in batches]
        self._apply()
        return tf.add_n([o[0] for o in outs]), tf.add_n([o[1] for o in outs])

    def body(self, batches: Sequence[Batch]) -> tuple[tf.Tensor, tf.Tensor]:
        """One optimizer step, to be traced inside a larger compiled call (:func:`make_multi_step`)."""
        outs = [self._micro_step(batch) for batch in batches]
        self._apply_step()
        return tf.add_n([o[0] for o in outs]), tf.add_n([o[1] for o in outs])

    def accumulate(self, batches: Sequence[Batch]) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """The micro-steps alone (for :class:`TimedStep`): loss sum, correct count and the mean
        gradients, with the accumulators zeroed for the next step."""
        if len(batches) != self.accum_steps:
            raise ValueError(f"an optimizer step takes {self.accum_steps} micro-batches (got {len(batches)})")
        outs = [self._micro(batch) for batch in batches]
        mean = [tf.convert_to_tensor(total) / float(self.accum_steps) for total in self._sums]
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        return tf.add_n([o[0] for o in outs]), tf.add_n([o[1] for o in outs]), mean


class TimedStep:
    """The optimizer step as three compiled calls, so the all-reduce is timed apart from the gradients.

    ``gradients`` (forward, backward; with ``accum_steps > 1`` one call per
    micro-batch, summed into accumulators), ``all-reduce`` (the grouped
    all-reduce of the averaged gradients), ``apply`` (the optimizer update).
    Each timed phase ends by reading one value it produced (the loss sum, the
    smallest reduced gradient): on CPU a compiled call returns when its work is
    done; on a GPU that read waits for the device. After each call,
    ``allreduce_seconds`` holds the all-reduce's wall time (which includes
    waiting for slower ranks). The arithmetic is the fused step's, op for op.
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                 inputs: Sequence[str], accum_steps: int = 1, allreduce: Allreduce = distributed.allreduce_grads,
                 guard: Optional[FiniteGuard] = None):
        self.accum_steps = accum_steps
        self._model, self._optimizer, self._allreduce, self._guard = model, optimizer, allreduce, guard
        self._names, self._label, self._head = tuple(inputs), label_feature, _head(allreduce)
        self._accumulate = AccumulatingStep(model, optimizer, label_feature, accum_steps, inputs,
                                            allreduce) if accum_steps > 1 else None
        self._gradients = tf.function(self._gradients_step, reduce_retracing=True, autograph=False)
        self._reduce = tf.function(lambda grads: self._allreduce(grads), reduce_retracing=True, autograph=False)
        self._apply = tf.function(self._apply_step, reduce_retracing=True, autograph=False)
        self.allreduce_seconds: Optional[float] = None

    def _gradients_step(self, batch: Batch) -> tuple[list[Any], tf.Tensor, tf.Tensor]:
        return _gradients(self._model, self._optimizer, self._head, batch, self._names, self._label)

    def _apply_step(self, grads: Sequence[Any]) -> None:
        _apply(self._optimizer, grads, self._model.trainable_variables, self._guard)

    def __call__(self, batches: Sequence[Batch]) -> tuple[tf.Tensor, tf.Tensor]:
        if self._accumulate is not None:
            loss_sum, correct, grads = self._accumulate.accumulate(batches)
        else:
            grads, loss_sum, correct = self._gradients(batches[0])
        _ready([loss_sum])
        start = time.perf_counter()
        reduced = self._reduce(list(grads))
        _ready(reduced)
        self.allreduce_seconds = time.perf_counter() - start
        self._apply(reduced)
        return loss_sum, correct


def _ready(tensors: Sequence[Any]) -> None:
    """Wait for a phase's results by reading its smallest output (tiny on the host, a sync on a GPU)."""
    dense = [t for t in tensors if isinstance(t, tf.Tensor)]
    if dense:
        min(dense, key=lambda t: t.shape.num_elements() or 0).numpy()


def make_optimizer_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                        inputs: Sequence[str], accum_steps: int = 1, reduction: Reduction = Reduction(),
                        guard: Optional[FiniteGuard] = None) -> OptimizerStep:
    """The step the training loop calls with ``accum_steps`` batches at a time; pass a ``guard`` with
    ``reduction.fp16`` so that a step whose float16 all-reduce overflowed is skipped on every rank."""
    if accum_steps == 1:
        fused = tf.function(train_step_body(model, optimizer, label_feature, inputs, reduction, guard), autograph=False)
        return lambda batches: fused(batches[0])
    return AccumulatingStep(model, optimizer, label_feature, accum_steps, inputs, reduction, guard)


def make_unrolled_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                       inputs: Sequence[str], accum_steps: int = 1, reduction: Reduction = Reduction(),
                       guard: Optional[FiniteGuard] = None) -> OptimizerStep:
    """:func:`make_optimizer_step`'s step unrolled (``train.steps_per_call`` > 1): one compiled call takes the
    batches of up to that many optimizer steps (:func:`make_multi_step`)."""
    if accum_steps == 1:
        body = train_step_body(model, optimizer, label_feature, inputs, reduction, guard)
        return make_multi_step(lambda batches: body(batches[0]), 1)
    accumulating = AccumulatingStep(model, optimizer, label_feature, accum_steps, inputs, reduction, guard)
    return make_multi_step(accumulating.body, accum_steps)


def make_timed_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, label_feature: str,
                    inputs: Sequence[str], accum_steps: int = 1, reduction: Reduction = Reduction(),
                    guard: Optional[FiniteGuard] = None) -> TimedStep:
    """:func:`make_optimizer_step`'s step as a :class:`TimedStep`, which measures its all-reduce."""
    return TimedStep(model, optimizer, label_feature, inputs, accum_steps, reduction, guard)


def make_eval_step(model: keras.Model, label_feature: str, inputs: Optional[Sequence[str]] = None,
                   head: Head = Head()) -> Callable[[Batch], dict[str, tf.Tensor]]:
    """A compiled inference step: per-example (weighted) loss and the scores evaluation counts
    (:meth:`Head.eval_outputs`)."""
    names = tuple(inputs) if inputs is not None else input_names(model)

    @tf.function(reduce_retracing=True, autograph=False)
    def eval_step(batch: Batch) -> dict[str, tf.Tensor]:
        return head.eval_outputs(batch[label_feature], model({k: batch[k] for k in names}, training=False),
                                 batch.get(WEIGHT_FEATURE))

    return eval_step
