"""Text to fixed-length token ids with a WordPiece tokenizer (the `tokenizers` library).

The vocabulary is either a supplied ``vocab.txt`` (e.g. a BERT vocabulary) or
learned from the training split only. The whole tokenizer (normalizer,
pre-tokenizer, vocabulary, truncation and padding) is saved as JSON in the
dataset, so executors, training and serving apply exactly the same thing.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

PAD, UNK = "[PAD]", "[UNK]"
SPECIAL_TOKENS = [PAD, UNK, "[CLS]", "[SEP]", "[MASK]"]


def _configure(tok: Tokenizer, lowercase: bool, max_length: Optional[int]) -> Tokenizer:
    # BertNormalizer: NFD accents handling off, control characters removed,
    # Chinese characters split; NFKC first folds compatibility forms.
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                   lowercase=lowercase),
    ])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if max_length is None:
        return tok
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(length=max_length, pad_id=tok.token_to_id(PAD), pad_token=PAD)
    return tok


def learn(texts: Iterable[str], vocab_size: int, lowercase: bool, max_length: int) -> Tokenizer:
    """Learn a WordPiece vocabulary from (training) texts."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    _configure(tok, lowercase, None)
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1,
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return _configure(tok, lowercase, max_length)


def from_vocab(vocab_lines: Sequence[str], lowercase: bool, max_length: int) -> Tokenizer:
    """A tokenizer from a vocab.txt (one token per line, id = line number)."""
    vocab = {token: i for i, token in enumerate(t.rstrip("\n") for t in vocab_lines) if token}
    missing = [t for t in (PAD, UNK) if t not in vocab]
    if missing:
        raise ValueError(f"the vocabulary lacks {', '.join(missing)}; a BERT-style vocab.txt has both")
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK))
    return _configure(tok, lowercase, max_length)


def vocab_lines(tok: Tokenizer) -> list[str]:
    """The vocabulary in id order (the vocab.txt format)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def encode(tok: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) as int64 arrays of shape [len(texts), max_length]."""
    encodings = tok.encode_batch(list(texts))
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    return ids, mask
