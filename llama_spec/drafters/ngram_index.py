"""Building blocks of the n-gram drafters (drafters/ngram.py): an incremental occurrence index
over a token history, ngram-mod's shareable pool, and the proposal accumulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .base import TOPK_WIDTH, Proposal

SYNC_WINDOW = 32          # tokens compared at the end of the history before each draft


def check_int(name: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or int(value) != value or not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


class HistoryIndex:
    """Occurrences of every n-gram of a token history that has a next token, kept incrementally.

    ``positions(key)`` lists (ascending) the starts j >= 1 with tokens[j:j+n] == key and
    j + n < len(tokens). Appending or cutting back a token costs O(n).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.tokens: list[int] = []
        self._pos: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self, key: tuple[int, ...]) -> list[int]:
        return self._pos.get(key, [])

    def extend(self, new: Iterable[int]) -> None:
        toks, n, pos = self.tokens, self.n, self._pos
        for t in new:
            toks.append(int(t))
            j = len(toks) - 1 - n   # the n-gram that t follows
            if j >= 1:
                pos.setdefault(tuple(toks[j : j + n]), []).append(j)

    def truncate(self, length: int) -> None:
        toks, n, pos = self.tokens, self.n, self._pos
        while len(toks) > length:
            j = len(toks) - 1 - n
            if j >= 1:
                key = tuple(toks[j : j + n])
                lst = pos[key]
                lst.pop()   # j is the newest occurrence of its key
                if not lst:
                    del pos[key]
            toks.pop()

    def sync(self, history: Sequence[int], *, full: bool = False) -> int:
        """Make the index hold `history`; return how many old tokens were kept.

        Only the last SYNC_WINDOW tokens are compared unless `full` (a new request): within a
        request the history only grows (begin/restore_prompt cut it back at request starts).
        """
        toks = self.tokens
        c = min(len(toks), len(history))
        for i in range(0 if full else max(0, c - SYNC_WINDOW), c):
            if toks[i] != history[i]:
                c = i
                break
        if c < len(toks):
            self.truncate(c)
        if len(history) > c:
            self.extend(history[c:])
        return c


class NgramPool:
    """ngram-mod's pool: n-gram -> (last token seen after it, counts of every token seen after it).

    Shareable by several drafters (one per generator or slot); not thread-safe. llama.cpp keeps
    a lossy 4M-entry hash table (collisions overwrite) and resets it when a quarter is used;
    this pool keys by the exact n-gram and resets past ``max_entries`` (= 4M / 4) at a begin.
    """

    def __init__(self, n_match: int = 24, max_entries: int = 1 << 20) -> None:
        self.n = check_int("n_match", n_match, 1, 1024)
        self.max_entries = check_int("max_entries", max_entries, 1, 1 << 40)
        self.last: dict[tuple[int, ...], int] = {}
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.generation = 0   # bumped by every reset (drafters re-learn their history then)

    def __len__(self) -> int:
        return len(self.last)

    def add(self, tokens: Sequence[int], i: int) -> None:
        """Learn that tokens[i + n] followed tokens[i : i + n]."""
        key = tuple(tokens[i : i + self.n])
        t = int(tokens[i + self.n])
        self.last[key] = t
        c = self.counts.get(key)
        if c is None:
            self.counts[key] = {t: 1}
        else:
            c[t] = c.get(t, 0) + 1

    def reset(self) -> None:
        self.last = {}
        self.counts = {}
        self.generation += 1


# ---------------------------------------------------------------------------------------------
# choosing tokens along a walk: sample from q, or take q's mode

Choose = Callable[[np.ndarray, np.ndarray], int]   # (ids int32 (s,), counts float64 (s,)) -> index


def choose_mode(ids: np.ndarray, counts: np.ndarray) -> int:
    return int(np.argmax(counts))   # ties: the first listed (the most recent continuation)


class ProposalParts:
    """Accumulates draft tokens, q (or none) and the optional top-k statistics."""

    def __init__(self, with_q: bool, topk: bool) -> None:
        self.tokens: list[int] = []
        self.q_ids: list[np.ndarray] | None = [] if with_q else None
        self.q_probs: list[np.ndarray] | None = [] if with_q else None
        self.topk = topk
        self.top_ids: list[np.ndarray] = []
        self.top_probs: list[np.ndarray] = []

    def add(self, tok: int, ids: np.ndarray, probs: np.ndarray) -> None:
        self.tokens.append(int(tok))
        if self.q_ids is not None and self.q_probs is not None:
            self.q_ids.append(ids)
            self.q_probs.append(probs)
        if self.topk:
            order = np.argsort(-probs, kind="stable")[:TOPK_WIDTH]
            self.top_ids.append(ids[order])
            self.top_probs.append(probs[order])

    def add_one_hot(self, tok: int) -> None:
        self.add(tok, np.array([tok], dtype=np.int32), np.ones(1, dtype=np.float32))

    def finish(self, grammar_masked: bool = False) -> Proposal:
        return Proposal(tokens=self.tokens, q_ids=self.q_ids, q_probs=self.q_probs,
                        topk_ids=self.top_ids if self.topk else None,
                        topk_probs=self.top_probs if self.topk else None, q_grammar_masked=grammar_masked)


def q_arrays(counts: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids int32 (s,), counts float64 (s,), q float32 (s,)) of a continuation count table."""
    ids = np.fromiter(counts.keys(), dtype=np.int32, count=len(counts))
    cnt = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    return ids, cnt, (cnt / cnt.sum()).astype(np.float32)
