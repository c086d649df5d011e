"""The contract between a dataset's manifest and a model: which features a model kind reads, their
dtypes and shapes, and what the model builder needs to know (:class:`ModelContract`).

A builder (built-in or ``model.kind: custom``) sees only the contract: each
feature's name, dtype, shape and vocabulary / category sizes, the task, the
label names and the width its output must have.

Pure and free of TensorFlow: :mod:`hvdtrain.model.models` and the checks that run before
any rank starts work import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from hvdtrain.core import tasks
from hvdtrain.core.config import ModelConfig
from hvdtrain.core.errors import DataError
from hvdtrain.data.manifest import FeatureSpec, Manifest

# The features each model kind reads. A transformer needs both; an MLP reads
# whichever of its features the dataset has (at least one).
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "transformer": ("input_ids", "attention_mask"),
    "mlp": ("numeric", "categorical"),
    "custom": ("input_ids", "attention_mask", "numeric", "categorical"),  # whichever the dataset has
}
KEY_FEATURE = "key"  # the record keys, read when tracing the data order
# float32 [] per-example loss weight, written when the ETL has source.weight_column (hvdtrain.model.heads.Head.loss)
WEIGHT_FEATURE = "weight"


@dataclass(frozen=True)
class Feature:
    """One model input: ``dtype`` and ``shape`` without the batch axis, and what its values index.

    ``vocab_size`` (token ids: ``input_ids``), ``cardinalities`` (one size per
    ``categorical`` column, the unknown bucket 0 included) and ``columns`` (the
    source columns behind ``numeric`` / ``categorical``, in order).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    vocab_size: Optional[int] = None
    cardinalities: tuple[int, ...] = ()
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputShape:
    """What the model builder needs to know about the data (the model contract).

    Text datasets fill ``max_length`` and ``vocab_size``; tabular ones
    ``numeric_features`` (width of ``numeric``), ``cardinalities`` (one per
    ``categorical`` column, unknown bucket included) and ``hash_buckets`` (one
    per ``categorical`` column, 0 unless hashed). ``inputs`` are the
    features the model reads, in order; ``features`` describes each of them.
    ``task`` is one of :data:`hvdtrain.core.tasks.KINDS`; ``labels`` the class or
    label names (empty for regression); the model must return
    ``[batch, num_outputs]`` float scores (logits; the value for regression).
    ``weight_feature`` names the per-example loss weight when the dataset has one (never a model input).
    ``ple_edges``: per slot of ``numeric``, the ETL's sorted quantile edges on the scaled values
    (``preprocessing.tabular.ple_edges``; empty when the manifest has none), which ``numeric_embedding: ple`` needs.
    """

    max_length: int
    vocab_size: int
    num_classes: int
    label_feature: str
    kind: str = "transformer"
    inputs: tuple[str, ...] = MODEL_INPUTS["transformer"]
    numeric_features: int = 0
    cardinalities: tuple[int, ...] = ()
    # Per ``categorical`` column: its hash bucket count when the ETL hashed it (etl.categorical_hash_buckets;
    # ids 1..n, 0 = missing, so its cardinality is n + 1), 0 when it has a vocabulary.
    hash_buckets: tuple[int, ...] = ()
    task: str = "multiclass"
    labels: tuple[str, ...] = field(default=(), compare=False)
    features: dict[str, Feature] = field(default_factory=dict, compare=False)
    weight_feature: Optional[str] = None
    ple_edges: tuple[tuple[float, ...], ...] = field(default=(), compare=False)

    @property
    def num_outputs(self) -> int:
        return tasks.outputs(self.task, self.num_classes)

    @property
    def read_features(self) -> tuple[str, ...]:
        """The features a training or evaluation batch holds: the model's inputs, the label, the weight if any."""
        return (*self.inputs, self.label_feature, *([self.weight_feature] if self.weight_feature else []))

    def input_specs(self) -> dict[str, tuple[str, list[int]]]:
        """(dtype, shape without the batch axis) of each model input."""
        specs = {"input_ids": ("int64", [self.max_length]), "attention_mask": ("int64", [self.max_length]),
                 "numeric": ("float32", [self.numeric_features]),
                 "categorical": ("int64", [len(self.cardinalities)])}
        return {name: specs[name] for name in self.inputs}


ModelContract = InputShape  # the name builders know it by


def model_inputs(kind: str, features: Sequence[str]) -> tuple[str, ...]:
    """The features a model of ``kind`` reads from a dataset with ``features`` (pure)."""
    if kind not in MODEL_INPUTS:
        raise DataError(f"model.kind {kind!r} has no input contract; use one of {', '.join(MODEL_INPUTS)}")
    if kind in ("mlp", "custom"):
        return tuple(name for name in MODEL_INPUTS[kind] if name in features)
    return MODEL_INPUTS[kind]


def required_features(model_cfg: ModelConfig, label_feature: str, max_length: int,
                      features: Sequence[str] = ()) -> dict[str, FeatureSpec]:
    """Features (dtype, shape) a model of this kind reads (pure); a wanted length of 0 means any."""
    wanted = {"input_ids": FeatureSpec("int64", [max_length]), "attention_mask": FeatureSpec("int64", [max_length]),
              "numeric": FeatureSpec("float32", [0]), "categorical": FeatureSpec("int64", [0])}
    inputs = model_inputs(model_cfg.kind, features)
    if model_cfg.kind == "custom" and "input_ids" in inputs and "attention_mask" not in inputs:
        inputs = inputs + ("attention_mask",)  # reported missing below
    if not inputs:
        raise DataError(f"model.kind={model_cfg.kind} needs feature 'numeric' {_describe(wanted['numeric'])} "
                        f"and/or 'categorical' {_describe(wanted['categorical'])}, but the dataset has neither "
                        f"(it has {', '.join(features) or 'none'}): use model.kind=transformer for a text "
                        "dataset, or set source.numeric_columns/categorical_columns and rerun the ETL")
    return {name: wanted[name] for name in inputs}


def _fits(have: FeatureSpec, want: FeatureSpec) -> bool:
    """Same dtype and shape; a wanted length of 0 means "any positive length"."""
    if have.dtype != want.dtype or len(have.shape) != len(want.shape):
        return False
    return all(w == h if w else h > 0 for h, w in zip(have.shape, want.shape))


def _describe(spec: FeatureSpec, name: str = "") -> str:
    """``int64[12]``; a wanted length of 0 shows as ``max_length`` (text) or ``n`` (any width)."""
    free = "max_length" if name in MODEL_INPUTS["transformer"] else "n"
    return f"{spec.dtype}[{', '.join(str(d) if d else free for d in spec.shape)}]"


def _missing_fix(kind: str, features: Sequence[str]) -> str:
    """What to do about a missing model input: another model kind, or a newer ETL."""
    for other, names in MODEL_INPUTS.items():
        if other not in (kind, "custom") and any(n in features for n in names):
            return f"the dataset has {other} inputs: set model.kind={other}, or rerun the ETL for {kind} features"
    return "rerun the ETL with this hvdtrain version"


def _check_features(manifest: Manifest, who: str, wanted: dict[str, FeatureSpec]) -> None:
    """Each wanted feature is in the manifest with a fitting spec; ``who`` names what needs it."""
    where = manifest.location or "manifest"
    for name, want in wanted.items():
        have = manifest.features.get(name)
        if have is None:
            has = ", ".join(f"{k} {_describe(v)}" for k, v in manifest.features.items()) or "none"
            raise DataError(f"{where}: feature {name!r} is missing (the dataset has: {has}) but "
                            f"{who} needs {name} {_describe(want, name)}; "
                            f"{_missing_fix(who.partition('=')[2], list(manifest.features))}")
        if not _fits(have, want):
            raise DataError(f"{where}: feature {name!r} is {_describe(have)} in the dataset but "
                            f"{who} needs {_describe(want, name)}; "
                            "rerun the ETL, or fix the feature spec it writes")


def _check_task(manifest: Manifest, task: Optional[str]) -> None:
    """The dataset's labels were encoded for the task this run trains (and there are enough of them)."""
    where = manifest.location or "manifest"
    if task is not None and task != manifest.task:
        raise DataError(f"{where}: the dataset's labels were encoded for task {manifest.task}, but this run's "
                        f"task is {task}: rerun the ETL with task: {task}, or set task: {manifest.task}")
    dtype, shape = tasks.label_spec(manifest.task, manifest.num_classes)
    _check_features(manifest, "label", {manifest.label_feature: FeatureSpec(dtype, shape)})
    least = {"multiclass": 2, "binary": 2, "multilabel": 1, "regression": 0}[manifest.task]
    if manifest.num_classes < least:
        raise DataError(f"{where}: labels {manifest.labels!r} has {manifest.num_classes} class(es); "
                        f"a {manifest.task} model needs >= {least}: check the source's label column")


def check_manifest(manifest: Manifest, model_cfg: ModelConfig, task: Optional[str] = None) -> InputShape:
    """Fail before training when the dataset cannot feed the model (of ``task``, when given).

    Raises:
        DataError: naming the feature, the dataset's spec and the spec the model needs.
    """
    ids = manifest.features.get("input_ids")
    max_length = ids.shape[0] if ids is not None and len(ids.shape) == 1 and ids.shape[0] > 0 else 0
    wanted = required_features(model_cfg, manifest.label_feature, max_length, list(manifest.features))
    _check_features(manifest, f"model.kind={model_cfg.kind}", wanted)
    _check_task(manifest, task)
    inputs = tuple(wanted)
    text = _text_sizes(manifest, max_length) if "input_ids" in inputs else (0, 0)
    tabular = _tabular_shape(manifest, inputs)
    return InputShape(text[0], text[1], manifest.num_classes, manifest.label_feature, kind=model_cfg.kind,
                      inputs=inputs, numeric_features=tabular.numeric_features, cardinalities=tabular.cardinalities,
                      hash_buckets=tabular.hash_buckets,
                      task=manifest.task, labels=tuple(manifest.labels),
                      features=describe_features(manifest, inputs, text[1], tabular.cardinalities),
                      weight_feature=_weight_feature(manifest),
                      ple_edges=_ple_edges(manifest, tabular.numeric_features,
                                           required=model_cfg.kind == "mlp" and model_cfg.numeric_embedding == "ple"))


def _ple_edges(manifest: Manifest, width: int, required: bool) -> tuple[tuple[float, ...], ...]:
    """The ETL's quantile edges per ``numeric`` slot (:mod:`etl.tabular`); () without them, unless ``required``.

    Raises:
        DataError: ``model.numeric_embedding: ple`` and the manifest has no usable edges (an older ETL).
    """
    found = manifest.preprocessing.get("tabular", {}).get("ple_edges")
    ok = (isinstance(found, list) and len(found) == width > 0
          and all(isinstance(col, list) and col and all(isinstance(v, (int, float)) and math.isfinite(v)
                                                        for v in col) and col == sorted(col) for col in found))
    if ok:
        return tuple(tuple(float(v) for v in col) for col in found)
    if required:
        where = manifest.location or "manifest"
        shown = found if not isinstance(found, list) else f"{len(found)} list(s)"
        raise DataError(f"{where}: model.numeric_embedding=ple needs preprocessing.tabular.ple_edges, one sorted "
                        f"list of finite edges per slot of feature 'numeric' ({width}), but it is {shown}: rerun "
                        "the ETL with this hvdtrain version (it records etl.ple_bins quantile edges), or use "
                        "model.numeric_embedding=periodic, which needs no fitted edges")
    return ()


def _weight_feature(manifest: Manifest) -> Optional[str]:
    """:data:`WEIGHT_FEATURE` when the dataset has sample weights (float32 [] only), else None."""
    if WEIGHT_FEATURE not in manifest.features:
        return None
    _check_features(manifest, "the sample weights (source.weight_column)", {WEIGHT_FEATURE: FeatureSpec("float32", [])})
    return WEIGHT_FEATURE


def _text_sizes(manifest: Manifest, max_length: int) -> tuple[int, int]:
    vocab_size = manifest.vocab.get("size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise DataError(f"{manifest.location or 'manifest'}: vocab.size is {vocab_size!r}; the embedding needs a "
                        "positive vocabulary size: rerun the ETL so the manifest records its vocabulary")
    return max_length, vocab_size


def describe_features(manifest: Manifest, inputs: Sequence[str], vocab_size: int,
                      cardinalities: tuple[int, ...]) -> dict[str, Feature]:
    """The contract's view of each model input (pure)."""
    tab = manifest.preprocessing.get("tabular", {})
    out = {}
    for name in inputs:
        spec = manifest.features[name]
        out[name] = Feature(name, spec.dtype, tuple(spec.shape),
                            vocab_size=vocab_size if name == "input_ids" else None,
                            cardinalities=cardinalities if name == "categorical" else (),
                            columns=tuple(tab.get("numeric_features") or tab.get("numeric_columns", ()))
                            if name == "numeric" else tuple(tab.get("categorical_columns", ()))
                            if name == "categorical" else ())
    return out


def _tabular_shape(manifest: Manifest, inputs: tuple[str, ...]) -> InputShape:
    """Sizes of the tabular features; categorical ones need the ETL's cardinalities."""
    where = manifest.location or "manifest"
    numeric = manifest.features["numeric"].shape[0] if "numeric" in inputs else 0
    cards: tuple[int, ...] = ()
    if "categorical" in inputs:
        width = manifest.features["categorical"].shape[0]
        found = manifest.preprocessing.get("tabular", {}).get("cardinalities")
        if (not isinstance(found, list) or len(found) != width
                or not all(isinstance(c, int) and c >= 1 for c in found)):
            raise DataError(f"{where}: preprocessing.tabular.cardinalities is {found!r}, but feature 'categorical' "
                            f"is int64[{width}]: the embeddings need one size >= 1 per column (unknown bucket "
                            "included); rerun the ETL with this hvdtrain version")
        cards = tuple(found)
    return InputShape(0, 0, manifest.num_classes, manifest.label_feature, kind="mlp", inputs=inputs,
                      numeric_features=numeric, cardinalities=cards, hash_buckets=_hash_buckets(manifest, cards))


def _hash_buckets(manifest: Manifest, cards: tuple[int, ...]) -> tuple[int, ...]:
    """Per categorical column, the ETL's hash bucket count (0: a vocabulary column); () without categoricals."""
    tab = manifest.preprocessing.get("tabular", {})
    buckets = tab.get("hash_buckets") or {}
    names = tab.get("categorical_columns") or []
    return tuple(int(buckets.get(c, 0)) for c in names) if cards and len(names) == len(cards) else ()
