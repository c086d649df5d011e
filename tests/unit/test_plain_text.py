"""The plain-text path of the tokenizer (hvdtrain.data.features.plain_text): token for token the tokenizer's own.

The corpus is real prose: the Python reference's topics as they ship with Python (pydoc_data), one row per line
(8,700 lines, about 0.1% of their characters non-ASCII: dashes, quotes, ß), plus rows that stress the border of
plain text (tabs, control characters, accents, full-width letters, upper case that NFKC or lower-casing change).
"""
from __future__ import annotations

import pydoc_data.topics
from collections import Counter

import numpy as np
import pytest

from hvdtrain.data import features

BORDER = ["Tab\tseparated\tWords", "line\r\nbreaks\nHERE", "bell\x07inside", "del\x7fchar", "Café CAFÉ café",
          "ＦＵＬＬ width", "ﬁne ligature", "", "   ", "UPPER lower MiXeD 123 !?", "a" * 150, "x\x1fy", "naïve",
          "中文 text", "\u00a0non-breaking space"]


def corpus() -> list[str]:
    lines = [ln for doc in pydoc_data.topics.topics.values() for ln in doc.split("\n") if ln.strip()]
    return lines + BORDER


def tokenizer(opts: features.TextOptions, vocab_size: int) -> features.Tokenizer:
    base = features.base(opts)
    counts = Counter(w for t in corpus() for w in features.words(base, t))
    return features.from_vocab(features.learn_vocab(counts, vocab_size), opts)


OPTIONS = [features.TextOptions(max_length=32),
           features.TextOptions(lowercase=False, max_length=24, truncation="left"),
           features.TextOptions(nfkc=False, strip_control_chars=False, max_length=16)]


@pytest.mark.parametrize("opts", OPTIONS, ids=["default", "cased-left", "no-nfkc-no-clean"])
def test_plain_text_gives_the_tokenizers_own_ids_on_real_prose(opts: features.TextOptions) -> None:
    texts = corpus()
    for vocab_size in (300, 3000):  # few whole words (many ## pieces and [UNK]) and many
        tok = tokenizer(opts, vocab_size)
        plain = features.plain_text(tok)
        assert plain is not None and plain.lowercase == opts.lowercase
        want = features.encode(tok, texts)
        wholly_plain = [t for t in texts if features._NOT_PLAIN.search(t) is None]
        assert len(wholly_plain) > 8000 and any(t != t.lower() for t in wholly_plain)
        for batch in (texts, texts[:500], wholly_plain):  # mixed batches, and one that takes the whole-batch path
            got = features.encode(tok, batch, plain)
            ref = want if batch is texts else features.encode(tok, batch)
            assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
        unk = tok.token_to_id(features.UNK)
        assert (want[0] == unk).any() or vocab_size > 300  # the small vocabulary does reach [UNK]


def test_several_text_columns_take_the_plain_path_to_the_same_ids() -> None:
    tok = tokenizer(OPTIONS[0], 1000)
    lines = corpus()
    rows = [(a, b if i % 7 else None) for i, (a, b) in enumerate(zip(lines[::2], lines[1::2]))]
    got = features.encode_columns(tok, rows, features.plain_text(tok))
    want = features.encode_columns(tok, rows)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_tokenizer_with_a_normalizer_of_unknown_effect_or_added_tokens_gets_no_plain_path() -> None:
    tok = tokenizer(OPTIONS[0], 300)
    tok.normalizer = features.normalizers.Sequence([features.normalizers.Replace("a", "b")])
    assert features.plain_text(tok) is None
    tok = tokenizer(OPTIONS[0], 300)
    tok.pre_tokenizer = features.pre_tokenizers.Whitespace()
    assert features.plain_text(tok) is None
    tok = tokenizer(OPTIONS[0], 300)
    tok.add_tokens(["Hello"])  # matched in the raw text, before lower-casing
    assert features.plain_text(tok) is None


def test_the_shard_writer_and_scoring_use_it() -> None:
    enc = features.FeatureEncoder(tokenizer(OPTIONS[0], 300).to_str(), None)
    assert enc.plain is not None
    texts = ["Plain TEXT here", "Café", "more plain text"]
    want = features.encode(enc.tok, texts)[0]
    assert np.array_equal(enc.encode(texts)["input_ids"], want)
    # The encoder tokenizes with its plain path: one that turns every e into é shows in the plain rows only.
    enc.plain = features.PlainText(tokenizer(OPTIONS[0], 300), lowercase=True)
    enc.plain.tok.normalizer = features.normalizers.Replace("e", "\u00e9")  # every plain word with an e changes
    got = enc.encode(texts)["input_ids"]
    assert not np.array_equal(got[[0, 2]], want[[0, 2]]) and np.array_equal(got[1], want[1])
