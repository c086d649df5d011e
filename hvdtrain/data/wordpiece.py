"""WordPiece vocabulary learning from word counts: deterministic, pure Python, no Spark.

The ETL counts words on the executors and hands the driver only the most
frequent candidates (:func:`candidates_limit` of them); this module learns
subword units from those (word, count) pairs the way WordPiece trainers do:
start from characters (a word's first character as itself, the rest as
``##`` continuations) and repeatedly merge the adjacent pair that occurs most
often, weighted by word count, until the vocabulary is full. Unseen words are
then spelled with learned multi-character pieces (greedy longest match, as
the ``tokenizers`` WordPiece model applies it), not letter by letter.

tokenizers' own ``WordPieceTrainer`` is not used: its result depends on
hash-map iteration order (huggingface/tokenizers#1794), so reruns of the ETL
would write different token ids. Here every choice has an explicit
tie-break — pairs by (count, then the pair's two tokens in code-point
order), characters by (count, then the character) — so the vocabulary is a
function of the counts alone: byte-identical whatever order or partitioning
they arrived in.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

PREFIX = "##"
CANDIDATES_PER_TOKEN = 10  # words that reach the driver per vocabulary entry (bounds the driver's memory)


def candidates_limit(vocab_size: int) -> int:
    """How many of the most frequent words the learner needs: enough to find every frequent subword."""
    return vocab_size * CANDIDATES_PER_TOKEN


def top_words(word_counts: Mapping[str, int], limit: int) -> list[tuple[str, int]]:
    """The ``limit`` most frequent words, ties broken by the word (what the Spark side selects)."""
    return heapq.nsmallest(limit, word_counts.items(), key=lambda kv: (-kv[1], kv[0]))


def alphabet(word_counts: Mapping[str, int], room: int) -> list[str]:
    """Initial units: for each character kept, itself and its ``##`` continuation, in character order.

    When characters would overflow ``room`` entries, the most frequent ones are kept (ties by character);
    the rest spell as ``[UNK]``.
    """
    freq: Counter = Counter()
    for word, n in word_counts.items():
        for c in word:
            freq[c] += n
    ranked = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:max(0, room) // 2]
    chars = sorted(c for c, _ in ranked)
    return chars + [PREFIX + c for c in chars]


def learn(word_counts: Mapping[str, int], vocab_size: int, specials: Sequence[str]) -> list[str]:
    """A WordPiece vocabulary of at most ``vocab_size`` entries: ``specials``, the alphabet, then merges in order.

    ``vocab_size`` is a hard cap counting special tokens and characters.
    """
    vocab = list(specials)[:vocab_size]
    units = alphabet(word_counts, vocab_size - len(vocab))
    vocab += units
    known = set(units)
    words = [(_spell(w), n) for w, n in sorted(word_counts.items()) if all(c in known for c in _spell(w))]
    seen = set(vocab)
    for token in _merges(words, vocab_size - len(vocab), seen):
        vocab.append(token)
    return vocab


def _spell(word: str) -> list[str]:
    return [word[0]] + [PREFIX + c for c in word[1:]] if word else []


def _join(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


class _Pairs:
    """Adjacent-pair counts over the words, with the words each pair occurs in and a max-heap of candidates."""

    def __init__(self, words: list[tuple[list[str], int]]):
        self.words = words
        self.count: Counter = Counter()
        self.where: dict[tuple[str, str], set[int]] = defaultdict(set)
        for i, (symbols, n) in enumerate(words):
            self._add(i, symbols, n)
        self.heap = [(-c, a, b) for (a, b), c in self.count.items()]
        heapq.heapify(self.heap)

    def _add(self, i: int, symbols: list[str], n: int, sign: int = 1) -> Iterable[tuple[str, str]]:
        pairs = list(zip(symbols, symbols[1:]))
        for pair in pairs:
            self.count[pair] += sign * n
            if sign > 0:
                self.where[pair].add(i)
        return pairs

    def best(self) -> tuple[str, str] | None:
        """The most frequent pair (ties: smallest tokens), skipping heap entries whose count is stale."""
        while self.heap:
            neg, a, b = heapq.heappop(self.heap)
            if -neg > 0 and self.count.get((a, b), 0) == -neg:
                return a, b
        return None

    def merge(self, a: str, b: str) -> None:
        """Replace every occurrence of (a, b) with the joined token, updating counts incrementally."""
        token, changed = _join(a, b), set[tuple[str, str]]()
        for i in sorted(self.where.pop((a, b), ())):
            symbols, n = self.words[i]
            merged = _merge_word(symbols, a, b, token)
            if merged is symbols:
                continue
            changed.update(self._add(i, symbols, n, sign=-1))
            changed.update(self._add(i, merged, n))
            self.words[i] = (merged, n)
        for pair in sorted(changed):
            c = self.count[pair]
            if c > 0:
                heapq.heappush(self.heap, (-c, pair[0], pair[1]))
            else:
                del self.count[pair]


def _merge_word(symbols: list[str], a: str, b: str, token: str) -> list[str]:
    """``symbols`` with each non-overlapping (a, b) left to right joined; the same list when none occurs."""
    out, i, hit = [], 0, False
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(token)
            i, hit = i + 2, True
        else:
            out.append(symbols[i])
            i += 1
    return out if hit else symbols


def _merges(words: list[tuple[list[str], int]], room: int, seen: set[str]) -> Iterable[str]:
    """New tokens from successive best-pair merges, at most ``room`` of them (a join already known adds none)."""
    pairs = _Pairs(words)
    added = 0
    while added < room:
        best = pairs.best()
        if best is None:
            return
        pairs.merge(*best)
        token = _join(*best)
        if token not in seen:
            seen.add(token)
            added += 1
            yield token
