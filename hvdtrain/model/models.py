"""Keras 3 model builders, chosen by ``model.kind``.

Every builder has one signature, ``build(contract, params) -> keras.Model``:
it sees the dataset's :class:`hvdtrain.data.contract.ModelContract` and a
dict of settings, and returns an uncompiled model whose output is
``[batch, contract.num_outputs]`` float scores (logits; the value itself for
regression). hvdtrain chooses the loss and metrics for the task
(:mod:`hvdtrain.model.heads`). ``model.kind: custom`` imports the user's
``model.builder`` (``package.module:function``); a built-in kind gets the
model block's fields merged with ``model.params``.

``transformer`` takes a dict of ``input_ids`` and ``attention_mask`` (int64,
shape ``[batch, max_length]``, mask 1 = token, 0 = padding); ``mlp`` takes
``numeric`` (float32 ``[batch, k]``, already imputed and scaled by the ETL)
and/or ``categorical`` (int64 ``[batch, m]``, 0 = unknown bucket). Both return
float32 class logits, also under a mixed-precision policy (the logits layer
computes in float32, so the loss does too).

A user's builder may return a subclassed ``keras.Model`` whose class is
registered and has ``get_config()``: it is wrapped in a functional model over
the contract's features (:func:`as_functional`), so it trains and exports like
the others; one without them is refused in one line before any training.

The tabular ``mlp`` can embed its numeric features (``model.numeric_embedding``; Gorishniy, Rubachev and
Babenko, "On Embeddings for Numerical Features in Tabular Deep Learning", NeurIPS 2022): ``ple``, the
piecewise-linear encoding over the ETL's quantile edges, or ``periodic``, sin/cos of trainable frequencies,
each followed by a per-feature linear layer + ReLU (the paper's Q-L-R and PLR). Both are built from
``keras.ops`` over constants and ``EinsumDense``, not from a layer class of hvdtrain's own: a registered class
would have to be imported wherever ``model.keras`` is loaded (scoring's executors, MLflow serving), and the
built-ins need nothing.

The built-in models are functional graphs of built-in layers and ``keras.ops`` only, so
``model.keras`` (and the MLflow Keras flavor built on it) loads with plain
``keras.models.load_model``: no hvdtrain import and no custom objects at
serving time.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

import keras
import numpy as np
from keras import layers, ops

from hvdtrain.core.config import ModelConfig
from hvdtrain.core.errors import ANY_ERROR, ConfigError

if TYPE_CHECKING:
    from hvdtrain.data.contract import InputShape

# train.mixed_precision -> Keras dtype policy (variables stay float32 under both mixed policies).
POLICIES = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
AUTO_EMBED_MAX = 32  # model.categorical_embed_dim: auto never gives a column a wider embedding
_UNBOUNDED = float(np.finfo(np.float32).max)  # a bound that clips nothing (JSON has no infinity)


def _embed(input_ids: Any, vocab_size: int, max_length: int, embed_dim: int) -> Any:
    """Token embedding plus a learned embedding of each position."""
    positions = ops.cumsum(ops.ones_like(input_ids), axis=1) - 1  # 0..max_length-1, from the input's shape
    tokens = layers.Embedding(vocab_size, embed_dim, name="token_embedding")(input_ids)
    return tokens + layers.Embedding(max_length, embed_dim, name="position_embedding")(positions)


def _encoder_block(x: Any, key_mask: Any, p: dict[str, Any], name: str) -> Any:
    """Post-norm encoder block: self-attention over real tokens, then a feed-forward net."""
    attended = layers.MultiHeadAttention(p["num_heads"], p["embed_dim"] // p["num_heads"], dropout=p["dropout"],
                                         name=f"{name}_attention")(x, x, attention_mask=key_mask)
    x = layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm1")(
        x + layers.Dropout(p["dropout"], name=f"{name}_drop1")(attended))
    ffn = layers.Dense(p["ff_dim"], activation="gelu", name=f"{name}_ffn_in")(x)
    ffn = layers.Dense(p["embed_dim"], name=f"{name}_ffn_out")(ffn)
    return layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm2")(
        x + layers.Dropout(p["dropout"], name=f"{name}_drop2")(ffn))


def _masked_mean(x: Any, attention_mask: Any) -> Any:
    """Mean over real tokens (an all-padding row pools to zeros)."""
    mask = ops.expand_dims(ops.cast(attention_mask, x.dtype), -1)
    return ops.sum(x * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0)


def transformer_classifier(shape: "InputShape", params: dict[str, Any]) -> keras.Model:
    """Transformer encoder over text returning scores ``[batch, num_outputs]``."""
    max_length = shape.max_length
    input_ids = keras.Input((max_length,), dtype="int64", name="input_ids")
    attention_mask = keras.Input((max_length,), dtype="int64", name="attention_mask")
    # [batch, 1, keys]: every query position attends to real tokens only.
    key_mask = ops.expand_dims(ops.cast(attention_mask, "bool"), 1)
    x = layers.Dropout(params["dropout"], name="embedding_dropout")(_embed(input_ids, shape.vocab_size, max_length,
                                                                           params["embed_dim"]))
    for i in range(params["num_layers"]):
        x = _encoder_block(x, key_mask, params, name=f"block{i}")
    x = layers.Dropout(params["dropout"], name="pooled_dropout")(_masked_mean(x, attention_mask))
    logits = layers.Dense(shape.num_outputs, dtype="float32", name="logits")(x)
    return keras.Model({"input_ids": input_ids, "attention_mask": attention_mask}, logits, name="text_transformer")


def _categorical_embedding(categorical: Any, cardinalities: tuple[int, ...], dim: int) -> Any:
    """One embedding table per column, stored as a single table with per-column offsets.

    An index outside its column's range (a category the ETL never saw) maps to
    that column's unknown bucket 0 instead of reading another column's rows.
    """
    sizes = ops.convert_to_tensor(list(cardinalities), dtype="int64")
    offsets = ops.convert_to_tensor([sum(cardinalities[:j]) for j in range(len(cardinalities))], dtype="int64")
    known = ops.logical_and(categorical >= 0, categorical < sizes)
    ids = ops.where(known, categorical, ops.zeros_like(categorical)) + offsets
    table = layers.Embedding(sum(cardinalities), dim, name="categorical_embedding")(ids)  # [batch, m, dim]
    return layers.Flatten(name="categorical_flat")(table)


def embedding_widths(cardinalities: Sequence[int], setting: Union[int, str]) -> tuple[int, ...]:
    """Embedding width per categorical column (pure): ``setting`` itself, or for ``auto`` fastai's rule
    ``round(1.6 * cardinality ** 0.56)`` (cardinality with the unknown bucket) capped at :data:`AUTO_EMBED_MAX`."""
    if setting == "auto":
        return tuple(min(AUTO_EMBED_MAX, round(1.6 * c ** 0.56)) for c in cardinalities)
    return tuple(int(setting) for _ in cardinalities)


def _categorical_embeddings(categorical: Any, cardinalities: tuple[int, ...], widths: tuple[int, ...]) -> Any:
    """One embedding table per column, each of its own width (``categorical_embed_dim: auto``), concatenated.

    As in :func:`_categorical_embedding`, an index outside the column's range maps to its unknown bucket 0.
    """
    parts = []
    for j, (size, width) in enumerate(zip(cardinalities, widths)):
        ids = ops.take(categorical, j, axis=1)
        ids = ops.where(ops.logical_and(ids >= 0, ids < size), ids, ops.zeros_like(ids))
        parts.append(layers.Embedding(size, width, name=f"categorical_embedding{j}")(ids))
    return parts[0] if len(parts) == 1 else layers.Concatenate(name="categorical_flat")(parts)


def ple_tables(edges: Sequence[Sequence[float]]) -> tuple[np.ndarray, ...]:
    """float32 ``(left, width, lower, upper)``, each ``[features, bins]``, of the piecewise-linear encoding (pure).

    Bin ``t`` of a feature with edges ``b_0 < ... < b_T`` is ``clip((x - b_t) / (b_{t+1} - b_t), lower, upper)``:
    in [0, 1], except that the first bin is not bounded below and the last not above (the paper's definition: a
    value beyond the training range keeps a slope). A feature with fewer bins than the widest has its padding
    bins fixed at 0; one with a single edge (a constant column) has the one bin ``x - b_0``.
    """
    bins = max([len(e) - 1 for e in edges] + [1])
    left = np.zeros((len(edges), bins), np.float32)
    width, lower, upper = np.ones_like(left), np.zeros_like(left), np.zeros_like(left)
    for j, col in enumerate(edges):
        e = np.asarray(col, np.float32)
        n = max(len(e) - 1, 1)
        left[j, :n] = e[:n]
        width[j, :n] = np.diff(e) if len(e) > 1 else 1.0  # in float32: (b_{t+1} - b_t) / width is exactly 1
        upper[j, :n] = 1.0
        lower[j, 0], upper[j, n - 1] = -_UNBOUNDED, _UNBOUNDED
    return left, width, lower, upper


def piecewise_linear_encoding(numeric: Any, edges: Sequence[Sequence[float]]) -> Any:
    """``[batch, features]`` -> ``[batch, features, bins]``: :func:`ple_tables`' encoding, in float32."""
    left, width, lower, upper = (ops.convert_to_tensor(a) for a in ple_tables(edges))
    x = ops.expand_dims(ops.cast(numeric, "float32"), -1)
    return ops.minimum(ops.maximum((x - left) / width, lower), upper)


def periodic_encoding(numeric: Any, frequencies: int, sigma: float) -> Any:
    """``[batch, features]`` -> ``[batch, features, 2 * frequencies]``: ``cos`` and ``sin`` of ``2 pi c x``, with a
    trainable ``c`` per feature and frequency drawn from N(0, sigma) (the paper's periodic embedding)."""
    features = numeric.shape[-1]
    angle = layers.EinsumDense("bk,kn->bkn", output_shape=(features, frequencies), dtype="float32",
                               kernel_initializer=keras.initializers.RandomNormal(0.0, sigma),
                               name="numeric_frequencies")(ops.cast(numeric, "float32") * (2.0 * np.pi))
    return ops.concatenate([ops.cos(angle), ops.sin(angle)], axis=-1)


def _numeric_part(numeric: Any, shape: "InputShape", params: dict[str, Any]) -> Any:
    """The numeric features as the MLP takes them: as they are, or embedded (``model.numeric_embedding``)."""
    kind = params.get("numeric_embedding", "auto")
    if kind == "auto":  # the default: ple where the ETL recorded its quantile edges (an older dataset: none)
        kind = "ple" if shape.ple_edges else "none"
    if kind == "none":
        return numeric
    if kind == "ple":
        if not shape.ple_edges:
            raise ConfigError("model.numeric_embedding", kind, "needs the ETL's quantile edges "
                              "(preprocessing.tabular.ple_edges), which this dataset's manifest lacks: rerun the ETL "
                              "with this hvdtrain version, or use model.numeric_embedding=periodic")
        encoded = piecewise_linear_encoding(numeric, shape.ple_edges)
    elif kind == "periodic":
        encoded = periodic_encoding(numeric, params["periodic_frequencies"], params["periodic_sigma"])
    else:
        raise ConfigError("model.numeric_embedding", kind, "must be one of auto, none, ple, periodic")
    features = encoded.shape[1]
    # One linear map per feature (kernel [features, encoding, dim], bias [features, dim]), then ReLU.
    embedded = layers.EinsumDense("bkt,ktd->bkd", output_shape=(features, params["numeric_embed_dim"]),
                                  bias_axes="kd", activation="relu", name="numeric_embedding")(encoded)
    return layers.Flatten(name="numeric_flat")(embedded)


def mlp_classifier(shape: "InputShape", params: dict[str, Any]) -> keras.Model:
    """Tabular MLP: numeric features (optionally embedded) and categorical embeddings, concatenated, then Dense
    layers."""
    inputs, parts = {}, []
    if "numeric" in shape.inputs:
        inputs["numeric"] = keras.Input((shape.numeric_features,), dtype="float32", name="numeric")
        parts.append(_numeric_part(inputs["numeric"], shape, params))
    if "categorical" in shape.inputs:
        inputs["categorical"] = keras.Input((len(shape.cardinalities),), dtype="int64", name="categorical")
        dim = params["categorical_embed_dim"]
        parts.append(_categorical_embeddings(inputs["categorical"], shape.cardinalities,
                                             embedding_widths(shape.cardinalities, dim)) if dim == "auto" else
                     _categorical_embedding(inputs["categorical"], shape.cardinalities, dim))
    x = parts[0] if len(parts) == 1 else layers.Concatenate(name="features")(parts)
    for i, units in enumerate(params["hidden_units"]):
        x = layers.Dense(units, activation="relu", name=f"dense{i}")(x)
        x = layers.Dropout(params["dropout"], name=f"dropout{i}")(x)
    logits = layers.Dense(shape.num_outputs, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="tabular_mlp")


Builder = Callable[["InputShape", dict[str, Any]], keras.Model]
BUILDERS: dict[str, Builder] = {
    "transformer": transformer_classifier,
    "mlp": mlp_classifier,
}
_BUILTIN_PARAMS = ("embed_dim", "num_heads", "ff_dim", "num_layers", "dropout", "hidden_units",
                   "categorical_embed_dim", "numeric_embedding", "numeric_embed_dim", "periodic_frequencies",
                   "periodic_sigma")


def builder_params(model_cfg: ModelConfig) -> dict[str, Any]:
    """What the builder receives: a built-in kind's fields under ``model.params``; custom: ``model.params``."""
    if model_cfg.kind == "custom":
        return dict(model_cfg.params)
    return {**{name: getattr(model_cfg, name) for name in _BUILTIN_PARAMS}, **model_cfg.params}


def import_code_dir(code_dir: Optional[str]) -> None:
    """Put ``model.code`` (the user's code folder) first on ``sys.path``, once."""
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)


def load_builder(path: str, code_dir: Optional[str] = None) -> Builder:
    """The function named ``package.module:function``; importing it registers the user's Keras objects.

    Raises:
        ConfigError: the module does not import or has no such callable (one line, exit 2).
    """
    import_code_dir(code_dir)
    module_name, _, func_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ANY_ERROR as exc:  # any failure of the user's import is a config problem to report
        where = f"model.code={code_dir} or " if code_dir else ""
        raise ConfigError("model.builder", path, f"does not import ({type(exc).__name__}: {exc}); put the module "
                          f"on {where}PYTHONPATH (or set model.code to its folder) and check its name") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError("model.builder", path, f"names no function {func_name!r} in module {module_name} "
                          f"({getattr(module, '__file__', '?')}); use package.module:function")
    return func


def resolve_builder(model_cfg: ModelConfig) -> Builder:
    """The builder of ``model.kind``: a built-in one, or the user's ``model.builder``."""
    if model_cfg.kind == "custom":
        return load_builder(model_cfg.builder or "", model_cfg.code)
    return BUILDERS[model_cfg.kind]


def check_built(model: Any, shape: "InputShape", who: str) -> keras.Model:
    """The builder returned a Keras model with the inputs it was given and ``num_outputs`` scores; a subclassed
    model comes back wrapped in a functional one (:func:`as_functional`)."""
    if not isinstance(model, keras.Model):
        raise ConfigError("model.builder", who, f"returned {type(model).__name__}, not a keras.Model: return "
                          "keras.Model(inputs, outputs) built from the contract's features")
    if not getattr(model, "inputs", None):
        model = as_functional(model, shape, who)
    width = model.outputs[0].shape[-1] if len(model.outputs) == 1 else None
    if width != shape.num_outputs:
        raise ConfigError("model.builder", who, f"returned a model with output shape "
                          f"{[tuple(o.shape) for o in model.outputs]}, but a {shape.task} task over "
                          f"{shape.num_classes} label(s) needs one output (batch, {shape.num_outputs}): end with "
                          "Dense(contract.num_outputs) and no activation")
    unknown = [t.name for t in model.inputs if t.name not in shape.inputs]
    if unknown:
        raise ConfigError("model.builder", who, f"returned a model with inputs {unknown} the dataset does not "
                          f"have; name keras.Input(...) after the contract's features: {', '.join(shape.inputs)}")
    return model


def as_functional(model: keras.Model, shape: "InputShape", who: str) -> keras.Model:
    """A subclassed model (no symbolic inputs) called on the contract's features as named ``keras.Input``s.

    Everything after the builder (the step's input names, the output check, the export and the inversion of a
    regression target appended to it) then sees a functional model; the subclassed one is its one layer, and
    its weights are the wrapper's. ``model.keras`` stores the class by its registered name and ``get_config()``,
    so a class without both is refused here, before any training, rather than after it at export.
    """
    name = type(model).__name__
    missing = [what for what, ok in (("get_config()", _has_config(model)),
                                     ("@keras.saving.register_keras_serializable(package=...)",
                                      _registered(type(model)))) if not ok]
    if missing:
        raise ConfigError("model.builder", who, f"returned a subclassed keras.Model {name} without "
                          f"{' and '.join(missing)}, so model.keras could not be saved and loaded back: build it "
                          "with the functional API (keras.Model(inputs, outputs)), or decorate the class with "
                          "@keras.saving.register_keras_serializable(package=...) and give it get_config() "
                          "returning its __init__ arguments")
    inputs = {feature: keras.Input(tuple(dims), dtype=dtype, name=feature)
              for feature, (dtype, dims) in shape.input_specs().items()}
    try:
        outputs = model(inputs)
    except ANY_ERROR as exc:  # the user's call() on the contract's features: a config problem to report
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError("model.builder", who, f"returned a subclassed keras.Model {name} whose call() fails on "
                          f"a dict of the contract's features {list(inputs)} ({type(exc).__name__}: {first}); "
                          "read the features from that dict by name") from None
    return keras.Model(inputs, outputs, name=model.name)


def _has_config(model: keras.Model) -> bool:
    try:
        model.get_config()
    except NotImplementedError:  # Keras: __init__ took arguments it cannot record by itself
        return False
    return True


def _registered(cls: type) -> bool:
    return keras.saving.get_registered_object(keras.saving.get_registered_name(cls)) is cls


@contextlib.contextmanager
def dtype_policy(mixed_precision: str) -> Iterator[None]:
    """Build layers under ``train.mixed_precision``'s policy; the global policy is restored after.

    Layers keep the policy they were built with (it is saved in ``model.keras``),
    so nothing global stays changed for later models in the same process.
    """
    if mixed_precision not in POLICIES:
        raise ValueError(f"train.mixed_precision must be one of {', '.join(POLICIES)} (got {mixed_precision!r})")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[mixed_precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(model_cfg: ModelConfig, shape: "InputShape", mixed_precision: str = "none") -> keras.Model:
    """The model named by ``model_cfg.kind``, built for this dataset's sizes and task."""
    if shape.kind != model_cfg.kind:
        raise ValueError(f"input shape is for model.kind={shape.kind}, not {model_cfg.kind}")
    builder = resolve_builder(model_cfg)
    with dtype_policy(mixed_precision):
        model = builder(shape, builder_params(model_cfg))
    return check_built(model, shape, model_cfg.builder or model_cfg.kind)
