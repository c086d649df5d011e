"""Text to fixed-length token ids: the code lives in :mod:`hvdtrain.features` (shared with scoring).

Re-exported here so the ETL's Spark side keeps one import path.
"""
from hvdtrain.features import (PAD, SPECIAL_TOKENS, UNK, TextOptions, base, encode, from_vocab,  # noqa: F401
                               learn_vocab, vocab_lines, words)
