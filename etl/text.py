"""Text to fixed-length token ids with a WordPiece tokenizer (the `tokenizers` library).

The vocabulary is either a supplied ``vocab.txt`` (e.g. a BERT vocabulary) or
learned from the training split only (word counts computed in Spark). The whole
tokenizer (normalizer, pre-tokenizer, vocabulary, truncation and padding) is
saved as JSON in the dataset, so executors, training and serving apply exactly
the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

PAD, UNK = "[PAD]", "[UNK]"
SPECIAL_TOKENS = [PAD, UNK, "[CLS]", "[SEP]", "[MASK]"]


@dataclass(frozen=True)
class TextOptions:
    lowercase: bool = True
    nfkc: bool = True
    strip_control_chars: bool = True
    max_length: int = 64
    truncation: str = "right"

    @classmethod
    def from_etl(cls, etl) -> "TextOptions":
        return cls(etl.lowercase, etl.unicode_nfkc, etl.strip_control_chars, etl.max_length, etl.truncation)

    def describe(self) -> dict:
        steps = (["NFKC"] if self.nfkc else []) + (["strip-control-chars"] if self.strip_control_chars else []) \
            + (["lowercase"] if self.lowercase else [])
        return {"normalization": steps, "tokenizer": "wordpiece", "max_length": self.max_length,
                "truncation": self.truncation, "padding": "right", "pad_id": 0}


def _normalizer(opts: TextOptions) -> normalizers.Normalizer:
    steps = [normalizers.NFKC()] if opts.nfkc else []
    # BertNormalizer(clean_text) drops control characters and maps whitespace to spaces.
    steps.append(normalizers.BertNormalizer(clean_text=opts.strip_control_chars, handle_chinese_chars=True,
                                            strip_accents=False, lowercase=opts.lowercase))
    return normalizers.Sequence(steps)


def _configure(tok: Tokenizer, opts: TextOptions, pad: bool) -> Tokenizer:
    tok.normalizer = _normalizer(opts)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if pad:
        tok.enable_truncation(max_length=opts.max_length, direction=opts.truncation)
        tok.enable_padding(length=opts.max_length, pad_id=tok.token_to_id(PAD), pad_token=PAD)
    return tok


def words(tok: Tokenizer, text: str) -> list[str]:
    """The words of a text after this tokenizer's normalizer and pre-tokenizer."""
    return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]


def base(opts: TextOptions) -> Tokenizer:
    """Normalizer and pre-tokenizer only: what word counting needs."""
    return _configure(Tokenizer(models.WordPiece(vocab={PAD: 0, UNK: 1}, unk_token=UNK)), opts, pad=False)


def learn_vocab(word_counts: dict[str, int], vocab_size: int) -> list[str]:
    """A WordPiece vocabulary from word counts, deterministically.

    Special tokens, then every character seen (alone and as a ``##``
    continuation, so any word can be spelled), then whole words by count,
    ties broken by the word. tokenizers' own WordPieceTrainer is not used: its
    result depends on hash-map iteration order (huggingface/tokenizers#1794),
    so reruns of the ETL would write different token ids.
    """
    chars = sorted({c for w in word_counts for c in w})
    vocab = list(SPECIAL_TOKENS) + chars + ["##" + c for c in chars]
    seen = set(vocab)
    for word, _ in sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if word not in seen:
            vocab.append(word)
            seen.add(word)
    return vocab


def from_vocab(vocab_lines: Sequence[str], opts: TextOptions) -> Tokenizer:
    """A tokenizer from a vocab.txt (one token per line, id = line number); [PAD] must be id 0."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(t.rstrip("\n") for t in vocab_lines):  # id = line number, so no gaps or repeats
        if not token:
            raise ValueError(f"line {i + 1} is blank; ids are line numbers, so every line must hold a token")
        if token in vocab:
            raise ValueError(f"token {token!r} on line {i + 1} repeats line {vocab[token] + 1}; "
                             "ids are line numbers, so every token must appear once")
        vocab[token] = i
    missing = [t for t in (PAD, UNK) if t not in vocab]
    if missing:
        raise ValueError(f"the vocabulary lacks {', '.join(missing)}; a BERT-style vocab.txt has both")
    if vocab[PAD] != 0:
        raise ValueError(f"[PAD] must be the first line (id 0), it is line {vocab[PAD] + 1}")
    return _configure(Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK)), opts, pad=True)


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
