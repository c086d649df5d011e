"""What the ETL fits on the training split before it writes a shard: labels, vocabulary, tokenizer, statistics.

Built once on the driver; the shard-writing tasks encode with it
(:mod:`etl.writer`) and the manifest records it (:mod:`etl.publish`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hvdtrain.data import manifest


@dataclass(frozen=True)
class Fitted:
    """What the job learned before writing, as plain data (the writer encodes with it, the manifest records it)."""

    labels: list[str]
    text_specs: dict[str, manifest.FeatureSpec] = field(default_factory=dict)
    vocab: Optional[list[str]] = None  # vocab.txt lines in id order; None for tabular-only data
    tokenizer_json: Optional[str] = None
    tabular_stats: Optional[dict[str, Any]] = None
    task: str = "multiclass"  # how labels are encoded (etl/labels.py; hvdtrain.core.tasks)
    target: Optional[dict[str, Any]] = None  # regression: the training target's statistics (etl.labels.target_stats)
    weighted: bool = False  # rows carry a sample weight (source.weight_column), written as the ``weight`` feature

    @property
    def encodings(self) -> dict[str, str]:
        """Feature -> packed encoding of the text features (``FeatureSpec.encoding``)."""
        return manifest.encodings(self.text_specs)
