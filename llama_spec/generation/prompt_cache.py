"""The host-RAM prompt cache: saved sequence states keyed by their tokens, LRU, bounded in bytes.

Words, used below exactly:

- an **entry**: the tokens whose KV cells (and recurrent state) a saved state holds, the target's
  sequence state (``llama_state_seq_get_data``) and the drafter's (None: a drafter that rebuilds
  its state from tokens, or that cannot save one).
- an entry's **size**: the bytes of its two states plus its token array; the cache's size is the
  sum over its entries and never exceeds ``limit`` (the bound is a hard limit: an entry larger
  than the whole limit is not stored, and older entries are evicted before a new one is added).
- the **reuse** of an entry for a prompt: the length of their longest common prefix, compared
  token by token over the whole prefix (never by a hash, so two prompts that share a hash-sized
  prefix but differ after it never get each other's state). On a recurrent or hybrid target a
  state can only be used whole: the reuse is the entry's length when its tokens are a prefix of
  the prompt, else 0 (a recurrent state cannot be truncated).

Threading: owned by one step core, used by its thread.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..drafters.base import common_prefix

__all__ = ["CacheEntry", "PromptCache", "common_prefix"]


@dataclass(eq=False)
class CacheEntry:
    tokens: np.ndarray           # int32 (n,): the positions 0..n-1 the states hold
    target: bytes                # the target's sequence state
    drafter: bytes | None        # the drafter's, None when it keeps none

    @property
    def nbytes(self) -> int:
        return len(self.target) + (len(self.drafter) if self.drafter is not None else 0) + self.tokens.nbytes


class PromptCache:
    """Entries by insertion/use order (LRU first); ``size`` <= ``limit`` bytes at all times."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"prompt cache: limit must be >= 0 bytes, got {limit_bytes}")
        self.limit = int(limit_bytes)
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next = 0
        self.size = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[CacheEntry]:
        return list(self._entries.values())

    def reuse(self, entry: CacheEntry, prompt: np.ndarray, whole_only: bool) -> int:
        """How many leading tokens of `prompt` the entry's state can serve (module docstring)."""
        n = common_prefix(entry.tokens, prompt)
        if whole_only:
            return n if n == len(entry.tokens) else 0
        return n

    def best(self, prompt: np.ndarray, whole_only: bool) -> tuple[CacheEntry | None, int]:
        """The entry with the longest reuse for `prompt` (marked most recently used), and that reuse."""
        best: tuple[int, int] | None = None
        for key, e in self._entries.items():
            n = self.reuse(e, prompt, whole_only)
            if n > 0 and (best is None or n > best[1]):
                best = (key, n)
        if best is None:
            self.misses += 1
            return None, 0
        self.hits += 1
        self._entries.move_to_end(best[0])
        return self._entries[best[0]], best[1]

    def put(self, tokens: np.ndarray, target: bytes, drafter: bytes | None, whole_only: bool) -> bool:
        """Store a state of `tokens`; False when it is larger than the limit (nothing stored).

        An entry whose tokens are a prefix of the new ones is dropped first (the new one serves every
        prompt it served), unless states can only be used whole (whole_only: it serves prompts the
        new one cannot, that diverge after it).
        """
        e = CacheEntry(np.array(tokens, dtype=np.int32, copy=True), target, drafter)
        if e.nbytes > self.limit or len(e.tokens) == 0:
            return False
        for key, old in list(self._entries.items()):
            same = common_prefix(old.tokens, e.tokens) == len(old.tokens)
            if same and (not whole_only or len(old.tokens) == len(e.tokens)):
                self._drop(key)
        while self._entries and self.size + e.nbytes > self.limit:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[self._next] = e
        self._next += 1
        self.size += e.nbytes
        return True

    def _drop(self, key: int) -> None:
        self.size -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0
