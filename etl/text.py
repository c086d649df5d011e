"""Text to fixed-length token ids: the code lives in :mod:`hvdtrain.data.features` (shared with scoring).

Re-exported here so the ETL's Spark side keeps one import path.
"""
from hvdtrain.data.features import (  # noqa: F401 - re-exported for etl callers
    PAD,
    SPECIAL_TOKENS,
    UNK,
    TextOptions,
    base,
    encode,
    from_vocab,
    learn_vocab,
    vocab_lines,
    words,
)
