"""Row-to-features code shared by the ETL (etl/) and batch scoring: pure, no Spark.

Training and serving cannot preprocess differently because there is one copy
of this code: the ETL's Spark tasks call it to write TFRecords, and scoring's
Spark tasks call it on raw rows with the tokenizer and statistics the ETL saved
(``tokenizer.json``, the manifest's ``preprocessing`` block). One exception:
categorical ids, which the ETL computes in Spark SQL (``etl.tabular.category_ids``)
and scoring here (:func:`category_ids_of`); a Spark test holds the two to the same
ids on the same values.

Text: normalization (NFKC, control characters, lowercasing), a WordPiece
tokenizer (the ``tokenizers`` library), truncation and padding to fixed-length
token ids. The vocabulary is either a supplied ``vocab.txt`` (e.g. a BERT
vocabulary) or learned from the training split only: word counts computed in
Spark, subword units learned from the most frequent words
(:mod:`hvdtrain.data.wordpiece`). The whole tokenizer is saved as JSON in the dataset, so executors,
training and serving apply exactly the same thing.

Tabular: imputation, categorical indexing, standard scaling with statistics
fitted on the training split (``etl/tabular.py`` fits them in Spark). Features:
``numeric`` float32 [len(numeric_columns)] and ``categorical`` int64
[len(categorical_columns)], where index 0 is the unknown bucket (missing,
unseen, or rarer than the top ``max_categories``); a column listed in
``etl.categorical_hash_buckets`` holds 1 + a stable hash of the value mod its
bucket count instead (0 still missing), so IDs with millions of values need no
vocabulary.

Labels: names to class indexes in the manifest's order.
"""
from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import xxhash
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from hvdtrain.data import wordpiece

# -- text --------------------------------------------------------------------------------------

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
    steps: list[normalizers.Normalizer] = [normalizers.NFKC()] if opts.nfkc else []
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


def learn_vocab(word_counts: Mapping[str, int], vocab_size: int) -> list[str]:
    """A WordPiece vocabulary of at most ``vocab_size`` entries learned from word counts, deterministically.

    Special tokens, the characters (alone and as ``##`` continuations, so any word can be spelled), then
    subword units from count-weighted pair merges (:mod:`hvdtrain.data.wordpiece`): the same counts give the
    same vocabulary, byte for byte, whatever order they come in.
    """
    return wordpiece.learn(word_counts, vocab_size, SPECIAL_TOKENS)


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


# Text that every normalizer hvdtrain configures leaves as it is but for its case: printable ASCII, tab and line
# breaks. NFKC (and NFC, NFD, NFKD) change no ASCII character; BertNormalizer's clean_text only turns \t, \n and
# \r into spaces, which the pre-tokenizer splits on all the same; there is no accent or CJK character to handle.
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\t\n\r]")
_ASCII_IDENTITY = {"NFC", "NFD", "NFKC", "NFKD", "BertNormalizer", "Lowercase"}


@dataclass(frozen=True)
class PlainText:
    """The tokenizer for plain text (:data:`_NOT_PLAIN` finds nothing in it): the same one without its
    normalizer, given text lower-cased by Python's ``str.lower`` when the normalizer lower-cases. Its tokens are
    the full tokenizer's, in about 58% of the time (6.3 against 10.8 us a row of eight words)."""

    tok: Tokenizer
    lowercase: bool


def plain_text(tok: Tokenizer) -> Optional[PlainText]:
    """:class:`PlainText` for a tokenizer, or None when its normalizer or pre-tokenizer is not one whose effect on
    plain text is known (then every text goes through the tokenizer itself)."""
    text = tok.to_str()
    spec = json.loads(text)
    if spec.get("added_tokens"):  # matched before the normalizer runs: not against text Python lower-cased
        return None
    norm = spec.get("normalizer")
    steps = (norm.get("normalizers") or [] if norm and norm.get("type") == "Sequence" else [norm] if norm else [])
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer" \
            or any(step.get("type") not in _ASCII_IDENTITY for step in steps):
        return None
    lowercase = any(step["type"] == "Lowercase" or step.get("lowercase") for step in steps)
    bare = Tokenizer.from_str(text)
    bare.normalizer = None
    return PlainText(bare, lowercase)


def _encodings(tok: Tokenizer, texts: Sequence[str], plain: Optional[PlainText]) -> list[Any]:
    """The tokenizer's encodings of ``texts``, the plain ones through ``plain`` (the same tokens, faster)."""
    # encode_batch_fast: the same ids and masks without character offsets, which nothing here reads
    full = getattr(tok, "encode_batch_fast", tok.encode_batch)
    texts = list(texts)
    if plain is None or not texts:
        return full(texts)
    fast = getattr(plain.tok, "encode_batch_fast", plain.tok.encode_batch)
    cased = (lambda batch: [t.lower() for t in batch]) if plain.lowercase else list
    if _NOT_PLAIN.search("\n".join(texts)) is None:  # the whole batch in one scan: the usual case
        return fast(cased(texts))
    is_plain = [_NOT_PLAIN.search(t) is None for t in texts]
    out: list[Any] = [None] * len(texts)
    for want, encoder, prepare in ((True, fast, cased), (False, full, list)):
        at = [i for i, p in enumerate(is_plain) if p is want]
        for i, encoding in zip(at, encoder(prepare([texts[i] for i in at])) if at else []):
            out[i] = encoding
    return out


def encode(tok: Tokenizer, texts: Sequence[str], plain: Optional[PlainText] = None) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) as int64 arrays of shape [len(texts), max_length]; ``plain``
    (:func:`plain_text` of ``tok``) tokenizes plain text faster, to the same ids."""
    encodings = _encodings(tok, texts, plain)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    return ids, mask


SEP = "[SEP]"
# Joins a row's text columns where they travel as one string (the ETL's validated ``text``); removed from every
# text first, so a row always splits back into its columns (a control character: the normalizer drops it anyway)
TEXT_SEP = "\x1f"


def shares(lengths: Sequence[int], budget: int) -> list[int]:
    """Tokens each text column keeps of ``budget`` (pure): the shortest take what they have, the rest split what
    is left evenly (a later column gets an odd token), so no share is wasted on a short column."""
    out = [0] * len(lengths)
    left, todo = budget, sorted(range(len(lengths)), key=lambda j: (lengths[j], j))
    for n, j in enumerate(todo):
        out[j] = min(lengths[j], left // (len(todo) - n))
        left -= out[j]
    return out


def encode_columns(tok: Tokenizer, rows: Sequence[Sequence[Optional[str]]],
                   plain: Optional[PlainText] = None) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) of rows of several text columns, in one sequence of ``max_length`` tokens.

    Each column is tokenized alone (the same normalization and WordPiece as one column); the columns follow one
    another with ``[SEP]`` between them (none when the vocabulary lacks it), each cut to its :func:`shares` of
    ``max_length`` minus the separators (from the end, or the start with ``truncation: left``). A missing column
    holds no token. The model sees one ``input_ids`` feature, as with one text column.
    """
    length = int((tok.padding or {}).get("length") or (tok.truncation or {})["max_length"])
    left = (tok.truncation or {}).get("direction") == "left"
    sep = tok.token_to_id(SEP)
    width = len(rows[0]) if rows else 0
    tokens = []
    for j in range(width):
        texts = [(r[j] or "").replace(TEXT_SEP, "") for r in rows]
        encodings = _encodings(tok, texts, plain)
        tokens.append([[t for t, m in zip(e.ids, e.attention_mask) if m] for e in encodings])
    budget = length - (width - 1 if sep is not None else 0)
    ids = np.zeros((len(rows), length), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i in range(len(rows)):
        cols = [tokens[j][i] for j in range(width)]
        keep = shares([len(c) for c in cols], budget)
        seq: list[int] = []
        for j, (col, n) in enumerate(zip(cols, keep)):
            if j and sep is not None:
                seq.append(sep)
            seq += (col[len(col) - n:] if left else col[:n]) if n else []
        ids[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
    return ids, mask


# -- tabular -----------------------------------------------------------------------------------

# The hash of hashed categorical columns (:func:`hash_bucket`), recorded in the manifest: XXH64 with seed 42 of the
# value's UTF-8 bytes, which is Spark SQL's own ``xxhash64``, so the ETL buckets in the JVM what scoring buckets here.
HASH = "xxhash64-42"
# Every scheme this hvdtrain reads: models whose ETL hashed with BLAKE2b (before 2026-11-30) still score as trained.
HASHES = (HASH, "blake2b-64")
_XXH_SEED = 42

# etl.datetime_parts: the cycle length of each periodic part (None: a plain number, scaled like the others)
DATETIME_PERIODS: dict[str, Optional[int]] = {"year": None, "month": 12, "day": 31, "day_of_week": 7,
                                              "day_of_year": 366, "hour": 24, "minute": 60}
_US_PER_DAY = 86_400_000_000


def datetime_feature_names(column: str, parts: Sequence[str]) -> list[str]:
    """The numeric features one date/timestamp column becomes: ``col:epoch``, then each part (periodic ones as
    ``col:part_sin``, ``col:part_cos``)."""
    names = [f"{column}:epoch"]
    for p in parts:
        names += [f"{column}:{p}"] if DATETIME_PERIODS[p] is None else [f"{column}:{p}_sin", f"{column}:{p}_cos"]
    return names


def datetime_values(raw: Any, kind: str, parts: Sequence[str]) -> np.ndarray:
    """float64 [n, len(datetime_feature_names)] from one column's values as Spark's ``unix_date`` (DATE: days
    since 1970-01-01) or ``unix_micros`` (TIMESTAMP: microseconds since the epoch, an instant); NaN/None missing.

    The first feature is the value itself (days for a DATE, seconds for a TIMESTAMP); the calendar parts are
    those of the instant in UTC, whatever the machine's or the Spark session's time zone, since the input is a
    number and not a wall clock. Periodic parts (0-based: month 0..11, day 0..30, Monday 0) become
    ``sin``/``cos`` of ``2 pi part / period``; the year stays a number. The ETL's fit, its shard writer and
    scoring all call this one function.
    """
    x = np.array([np.nan if v is None else float(v) for v in raw], dtype=np.float64)
    missing = np.isnan(x)
    whole = np.where(missing, 0.0, x).astype(np.int64)
    micros = whole * _US_PER_DAY if kind == "date" else whole
    days = np.floor_divide(micros, _US_PER_DAY)
    day = days.astype("datetime64[D]")
    cols = [x if kind == "date" else x / 1e6]
    for part in parts:
        if part == "year":
            value = day.astype("datetime64[Y]").astype(np.int64) + 1970
        elif part == "month":
            value = day.astype("datetime64[M]").astype(np.int64) % 12
        elif part == "day":
            value = (day - day.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64)
        elif part == "day_of_week":
            value = (days + 3) % 7  # 1970-01-01 was a Thursday (3, Monday being 0)
        elif part == "day_of_year":
            value = (day - day.astype("datetime64[Y]").astype("datetime64[D]")).astype(np.int64)
        elif part == "hour":
            value = np.floor_divide(micros, 3_600_000_000) % 24
        else:  # minute
            value = np.floor_divide(micros, 60_000_000) % 60
        period = DATETIME_PERIODS[part]
        if period is None:
            cols.append(value.astype(np.float64))
        else:
            angle = 2.0 * np.pi * value.astype(np.float64) / period
            cols += [np.sin(angle), np.cos(angle)]
    out = np.stack(cols, axis=1) if len(x) else np.zeros((0, len(cols)), np.float64)
    out[missing] = np.nan
    return out


def numeric_names(stats: dict[str, Any]) -> list[str]:
    """The slots of the ``numeric`` feature: the numeric columns, then each datetime column's features."""
    dt = stats.get("datetime") or {}
    return [*stats["numeric_columns"],
            *(n for c in dt.get("columns", []) for n in datetime_feature_names(c, dt.get("parts", [])))]


def fill_values(stats: dict[str, Any]) -> list[float]:
    """The value that replaces a missing entry, per slot of the ``numeric`` feature (:func:`numeric_names`)."""
    out = []
    for c in numeric_names(stats):
        s = stats["numeric"][c]
        if stats["impute"] == "constant" or s["count"] == 0:
            out.append(stats["impute_value"])
        else:
            out.append(s["mean"] if stats["impute"] == "mean" else s["median"])
    return out


def transform(stats: dict[str, Any], numeric: Sequence[Sequence[Optional[float]]],
              categorical: Sequence[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Apply fitted statistics to rows: (numeric float32 [n, k], categorical int64 [n, m]).

    A numeric row holds the values of ``numeric_columns`` (numbers, booleans as 0/1, decimals), then those of
    the datetime columns as :func:`datetime_values` takes them; ``None`` or NaN is missing.
    """
    return transform_arrays(stats, *row_arrays(stats, numeric, categorical))


def row_arrays(stats: dict[str, Any], numeric: Sequence[Sequence[Optional[float]]],
               categorical: Sequence[Sequence[Any]]) -> tuple[np.ndarray, list[list[Optional[str]]], int]:
    """Rows of raw values as :func:`transform_arrays` takes them: (float64 [n, k], the categorical columns'
    :func:`category_string` values, n)."""
    k = len(stats["numeric_columns"]) + len((stats.get("datetime") or {}).get("columns", []))
    n = len(numeric) if numeric_names(stats) else len(categorical)
    x = np.array([[np.nan if v is None else float(v) for v in row] for row in numeric],
                 dtype=np.float64).reshape(n, k)
    cats = len(stats["categorical_columns"])
    return x, [[category_string(row[j]) for row in categorical] for j in range(cats)], n


def transform_arrays(stats: dict[str, Any], x: np.ndarray,
                     categorical: Sequence[Sequence[Optional[str]]] | np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`transform` on columns: ``x`` float64 [n, k] (the numeric row's slots as numbers, NaN missing) and one
    list per categorical column of its values' :func:`category_string` (None missing), or the ids themselves, an
    int64 array [n, m] made by Spark SQL (the ETL's ``etl.tabular.category_ids``, checked against
    :func:`category_ids_of`). The ETL's shard writer hands these over from Arrow batches as they come, with no
    per-row Python."""
    dt_cols = (stats.get("datetime") or {}).get("columns", [])
    k = len(stats["numeric_columns"])
    cols = numeric_names(stats)
    x = np.asarray(x, dtype=np.float64).reshape(n, k + len(dt_cols))
    if dt_cols:
        dt = stats["datetime"]
        x = np.concatenate([x[:, :k], *(datetime_values(x[:, k + j], dt["kinds"][c], dt["parts"])
                                        for j, c in enumerate(dt_cols))], axis=1)
    fills = np.array(fill_values(stats), dtype=np.float64)
    x = np.where(np.isnan(x), fills[None, :], x)
    if stats["scale"] and cols:
        mean = np.array([stats["numeric"][c]["mean"] or 0.0 for c in cols])
        std = np.array([stats["numeric"][c]["std"] or 0.0 for c in cols])
        x = (x - mean) / np.where(std > 0, std, 1.0)
    if isinstance(categorical, np.ndarray) and not np.issubdtype(categorical.dtype, np.integer):
        raise TypeError(f"categorical ids must be integers, got an array of {categorical.dtype}; give the values "
                        "as one list per column instead")
    ids = (categorical.astype(np.int64, copy=False).reshape(n, len(stats["categorical_columns"]))
           if isinstance(categorical, np.ndarray) else category_ids_of(stats, categorical, n))
    return x.astype(np.float32), ids


def category_string(value: Any) -> Optional[str]:
    """A categorical value in the one string form the ETL fits and every encoder looks up (None: missing).

    The ETL counts these strings (:func:`etl.stats.category_value`): Spark's ``CAST(value AS STRING)``, and
    this function itself for floating point. Here the same string is made from the Python value a Spark row
    or an Arrow batch holds. Per type: booleans ``true``/``false`` (Python's ``str`` says ``True``); integers
    their digits; floating point Python's shortest round-trip ``repr`` of the double (``0.1``, ``1e-05``;
    a FLOAT column as the exact double Python receives, ``0.10000000149011612``), since Spark's digits come
    from the JVM's ``Double.toString``, not the shortest before Java 19 (``8.409999999999999E21``);
    decimals plain with the column's scale (``0.000000010``, where ``str`` gives ``1.0E-8``); dates
    ``2024-01-31``; timestamps ``2024-01-31 12:34:56.5`` (fraction without trailing zeros; the wall clock as
    received: Spark renders it in the session time zone, PySpark in the process's, the same by default).
    Anything else: ``str``.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.datetime):
        if value != value:  # pandas' NaT (a missing timestamp) is a datetime that differs from itself
            return None
        if value.tzinfo is not None:  # an aware value (Arrow): the wall clock of this process's zone
            value = value.astimezone().replace(tzinfo=None)
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        return f"{text}.{value.microsecond:06d}".rstrip("0") if value.microsecond else text
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def category_ids(stats: dict[str, Any], categorical: Sequence[Sequence[Any]], n: int) -> np.ndarray:
    """int64 [n, m]: per column, 1 + the vocabulary index of the value's :func:`category_string`, or its hash
    bucket (hashed columns); 0 for a missing value (and, in a vocabulary column, an unseen or rare one)."""
    columns = [[category_string(row[j]) for row in categorical] for j in range(len(stats["categorical_columns"]))]
    return category_ids_of(stats, columns, n)


def category_ids_of(stats: dict[str, Any], columns: Sequence[Sequence[Optional[str]]], n: int) -> np.ndarray:
    """:func:`category_ids` on columns: one list per categorical column of its values' :func:`category_string`."""
    names = stats["categorical_columns"]
    buckets = stats.get("hash_buckets") or {}
    scheme = stats.get("hash") or HASH
    out = np.zeros((n, len(names)), dtype=np.int64)
    for j, c in enumerate(names):
        values = columns[j]
        if c in buckets:
            out[:, j] = [0 if v is None else hash_bucket(v, buckets[c], scheme) for v in values]
        else:
            lookup = {v: i + 1 for i, v in enumerate(stats["categories"][c])}
            out[:, j] = [lookup.get(v, 0) for v in values]
    return out


def hash_bucket(value: str, buckets: int, scheme: str = HASH) -> int:
    """1 + a stable 64-bit hash of ``value``'s UTF-8 bytes mod ``buckets``.

    ``xxhash64-42`` (:data:`HASH`): XXH64 with seed 42 as a signed long, ``pmod`` ``buckets``: Spark SQL's
    ``pmod(xxhash64(value), buckets) + 1``, which the ETL computes on the JVM (``etl.tabular.category_ids``).
    ``blake2b-64``: BLAKE2b, 8 bytes, little-endian, mod ``buckets`` (what the ETL wrote before; read so that
    those models keep scoring). Both are the same in every process, host and Python version (unlike ``hash()``,
    which is salted per process); the manifest records the scheme.
    """
    data = value.encode("utf-8")
    if scheme == HASH:
        h = xxhash.xxh64_intdigest(data, _XXH_SEED)
        return 1 + (h - (1 << 64) if h >= 1 << 63 else h) % buckets  # Python's % of a positive is Spark's pmod
    if scheme == "blake2b-64":
        return 1 + int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % buckets
    raise ValueError(f"unknown categorical hash {scheme!r}; this hvdtrain hashes with {', '.join(HASHES)}")


def feature_specs(stats: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """Manifest feature entries (dtype, shape) for the tabular features."""
    out = {}
    if numeric_names(stats):
        out["numeric"] = ("float32", [len(numeric_names(stats))])
    if stats["categorical_columns"]:
        out["categorical"] = ("int64", [len(stats["categorical_columns"])])
    return out


def cardinalities(stats: dict[str, Any]) -> list[int]:
    """Embedding sizes the model needs: known categories (or hash buckets) + the unknown/missing bucket."""
    buckets = stats.get("hash_buckets") or {}
    return [buckets[c] + 1 if c in buckets else len(stats["categories"][c]) + 1 for c in stats["categorical_columns"]]


def check_hash(stats: Optional[dict[str, Any]]) -> None:
    """Refuse statistics whose hashed columns were bucketed by a scheme this hvdtrain does not know (:data:`HASHES`)."""
    if stats and stats.get("hash_buckets") and stats.get("hash") not in HASHES:
        raise ValueError(f"categorical columns {', '.join(stats['hash_buckets'])} were hashed with "
                         f"{stats.get('hash')!r}, this hvdtrain hashes with {' or '.join(map(repr, HASHES))}: rerun "
                         "the ETL and retrain with one hvdtrain version")


# -- labels ------------------------------------------------------------------------------------

def label_index(labels: Sequence[str]) -> dict[str, int]:
    """Label name -> class index, in the manifest's label order."""
    return {name: i for i, name in enumerate(labels)}


# -- rows to model features --------------------------------------------------------------------

class FeatureEncoder:
    """Raw column values of a batch of rows -> the model's input arrays.

    The one place a row becomes features: the ETL's shard writer and scoring
    both call :meth:`encode`, with the tokenizer JSON and tabular statistics
    the ETL fitted (the writer with categorical ids already made by Spark SQL,
    the same ids as :func:`category_ids_of`).
    """

    def __init__(self, tokenizer_json: Optional[str], tabular_stats: Optional[dict]):
        self.tok = Tokenizer.from_str(tokenizer_json) if tokenizer_json else None
        self.plain = plain_text(self.tok) if self.tok is not None else None
        check_hash(tabular_stats)
        self.stats = tabular_stats

    def encode(self, texts: Optional[Sequence[Any]], numeric: Sequence[Sequence[Optional[float]]] = (),
               categorical: Sequence[Sequence[Any]] = ()) -> dict[str, np.ndarray]:
        """Features by name: input_ids/attention_mask int64 [n, max_length], numeric float32, categorical int64.

        ``texts``: one string per row, or a tuple per row of its text columns' values (:func:`encode_columns`).
        ``numeric`` and ``categorical``: a tuple per row of the raw values (:func:`transform`).
        """
        if self.stats is None:
            return self.encode_arrays(texts, np.zeros((0, 0)), [], 0)
        return self.encode_arrays(texts, *row_arrays(self.stats, numeric, categorical))

    def encode_arrays(self, texts: Optional[Sequence[Any]], numeric: np.ndarray,
                      categorical: Sequence[Sequence[Optional[str]]] | np.ndarray, n: int) -> dict[str, np.ndarray]:
        """:meth:`encode` on columns (:func:`transform_arrays`): ``numeric`` float64 [n, k] (NaN missing) and one
        list per categorical column of its values' :func:`category_string` (None missing), or their ids."""
        out: dict[str, np.ndarray] = {}
        if self.tok is not None:
            texts = list(texts or [])
            several = bool(texts) and not isinstance(texts[0], str)  # a row of several text columns: a tuple
            out["input_ids"], out["attention_mask"] = encode_columns(self.tok, texts, self.plain) if several \
                else encode(self.tok, texts, self.plain)
        if self.stats is not None:
            num, cat = transform_arrays(self.stats, numeric, categorical, n)
            if numeric_names(self.stats):
                out["numeric"] = num
            if self.stats["categorical_columns"]:
                out["categorical"] = cat
        return out

    def unknown_tokens(self, ids: np.ndarray, mask: np.ndarray) -> tuple[int, int]:
        """(unknown-token count, real-token count) of encoded text (the drift check's text statistic)."""
        unk = self.tok.token_to_id(UNK) if self.tok is not None else None
        real = mask.astype(bool)
        return int(((ids == unk) & real).sum()) if unk is not None else 0, int(real.sum())
