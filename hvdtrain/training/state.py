"""The model and its optimizer: Adam on the warm-up/decay schedule, built before rank 0's state is broadcast;
the statistics each rank keeps on its own, averaged over ranks before they are evaluated, saved or exported."""
from __future__ import annotations

import keras

from hvdtrain import data
from hvdtrain.core.config import JobConfig, TrainConfig
from hvdtrain.model.models import build_model
from hvdtrain.model.schedules import WarmupDecay, scaled_learning_rate
from hvdtrain.runtime import distributed


def build_optimizer(train: TrainConfig, size: int, total_steps: int) -> keras.optimizers.Optimizer:
    """Adam on the warm-up/decay schedule, clipping by global norm; loss scaling under float16."""
    schedule = WarmupDecay(scaled_learning_rate(train.learning_rate, size), train.warmup_steps, total_steps,
                           train.lr_schedule, train.min_lr_ratio)
    optimizer = keras.optimizers.Adam(learning_rate=schedule, global_clipnorm=train.clip_norm)
    if train.mixed_precision == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def build_state(cfg: JobConfig, shape: data.InputShape, size: int,
                total_steps: int = 0) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """Model and built optimizer, ready for broadcast_state(); ``total_steps`` is the decay horizon.

    Reads cfg.model and cfg.train (the optimizer, its schedule and mixed precision).
    """
    model = build_model(cfg.model, shape, cfg.train.mixed_precision)
    optimizer = build_optimizer(cfg.train, size, total_steps)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def rank_local_statistics(model: keras.Model) -> list[keras.Variable]:
    """The model's floating-point non-trainable weights: what each rank updates from its own batches in the
    forward pass (BatchNormalization's ``moving_mean`` / ``moving_variance``), not through the averaged gradients.

    Seed-generator states (dropout randomness) are variables but not weights, so they are not here and stay
    per rank; integer weights (counters) are left alone too: a mean of counts is not a count.
    """
    return [v for v in model.non_trainable_weights if "float" in str(v.dtype)]


def average_statistics(model: keras.Model) -> None:
    """Replace every rank's :func:`rank_local_statistics` by their mean over ranks (a collective when the model
    has any; every rank holds the same model, so every rank decides alike).

    Called before each evaluation, checkpoint and export. The moving statistics never feed the training
    forward pass (BatchNormalization normalizes by the batch's own statistics while training), and each update
    is linear (``m * moving + (1 - m) * batch``), so averaging now and then leaves the weights of every step as
    they were, and the final statistics are the mean of the ranks' whatever the times they were averaged at.
    """
    distributed.average_variables(rank_local_statistics(model), name="hvdtrain.statistics")
