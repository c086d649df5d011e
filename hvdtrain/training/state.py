"""The model and its optimizer: Adam on the warm-up/decay schedule, built before rank 0's state is broadcast."""
from __future__ import annotations

import keras

from hvdtrain import data
from hvdtrain.config import JobConfig, TrainConfig
from hvdtrain.models import build_model
from hvdtrain.schedules import WarmupDecay, scaled_learning_rate


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
    """Model and built optimizer, ready for broadcast_state(); ``total_steps`` is the decay horizon."""
    model = build_model(cfg.model, shape, cfg.train.mixed_precision)
    optimizer = build_optimizer(cfg.train, size, total_steps)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
