"""Prompt-prefix reuse for the step core: which cells a new prompt keeps, and from where.

Words, used below exactly (and those of :mod:`.prompt_cache`):

- a slot's **cells**: the tokens its committed sequence holds, position by position (an idle
  slot: its prompt cache, ``_Slot.tokens``; a running one: its history so far).
- the **sources** of a new prompt in slot i: slot i's own cells, another slot's cells, and the
  entries of the host-RAM prompt cache. The reuse of a source is the longest common prefix of its
  tokens and the prompt, at most len(prompt) - 1 (the prompt's last token is always decoded: its
  logits give the first token). On a recurrent or hybrid target a source other than the slot's
  own cells counts only whole (``PromptCache.reuse``); the own cells count if llama.cpp can cut
  them there (``seq_rm``: within its ``n_rs_seq`` state snapshots, or nothing to cut).
- **stash**: before a slot's own cells are cut or replaced, they (target and drafter states) go
  into the RAM cache, so a conversation that comes back later finds them.

The source with the longest reuse wins; another slot's or an entry's states are copied into the
slot's sequence (``llama_state_seq_get/set_data``, target and drafter together) and cut to the
reuse. The drafter then keeps what it can (``Drafter.begin_prefix``); the target keeps as much.
Exactness: only the cells of tokens equal to the prompt's (compared token by token) are kept, so
no decision reads another prompt's state; the rest of the prompt is decoded from the reuse on, in
other batch shapes than a cold prefill (with repacked weights its logits can differ in the last
bits; see docs/prompt-cache.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .prompt_cache import CacheEntry, PromptCache, common_prefix

if TYPE_CHECKING:
    from ..drafters.base import Drafter
    from ..llama.context import Context

__all__ = ["PrefixReuse", "SlotCells"]

STASH_MIN = 16  # cells worth a RAM entry: a shorter prefix costs less to decode than to look up


class SlotCells(Protocol):
    """What prefix reuse needs of a slot (core._Slot)."""

    base: int
    drafter: Drafter | None
    tokens: np.ndarray


class PrefixReuse:
    """One step core's prefix reuse (module docstring). cells_of(slot): a slot's cells now."""

    def __init__(self, ctx: Context, slots: Sequence[SlotCells], width: int, recurrent: bool,
                 cache: PromptCache | None, cells_of: Callable[[SlotCells], np.ndarray]) -> None:
        self.ctx, self.slots, self.width, self.recurrent = ctx, slots, width, recurrent
        self.cache, self.cells_of = cache, cells_of

    def keep(self, slot: SlotCells, toks: np.ndarray, reuse: bool) -> int:
        """Make slot's sequence hold the cells of prompt `toks` from its best source (none when
        reuse is False); the drafter's state follows. Returns how many leading tokens are kept."""
        cap = len(toks) - 1
        own = slot.tokens
        n_own = min(common_prefix(own, toks), cap) if reuse else 0
        best = n_own
        load: tuple[SlotCells, np.ndarray] | CacheEntry | None = None
        if reuse:
            for other in self.slots:
                if other is not slot:
                    cells = self.cells_of(other)
                    n = self._whole(cells, toks, cap)
                    if n > best:
                        best, load = n, (other, cells)
            if self.cache is not None:
                entry, _ = self.cache.best(toks, self.recurrent)
                n = self._whole(entry.tokens, toks, cap) if entry is not None else 0
                if n > best:
                    best, load = n, entry
        if len(own) >= STASH_MIN and (load is not None or n_own < len(own)):
            self.stash(slot)
        if load is None:
            return self._cut(slot, n_own)
        if isinstance(load, tuple):
            src, _ = load
            target = self.ctx.save_state(src.base)
            drafted = src.drafter.save_prefix() if src.drafter is not None else None
        else:
            target, drafted = load.target, load.drafter
        self.clear(slot)
        self.ctx.load_state(target, slot.base)
        if slot.drafter is not None:
            slot.drafter.load_prefix(drafted)
        return self._cut(slot, best)

    def _whole(self, cells: np.ndarray, toks: np.ndarray, cap: int) -> int:
        n = common_prefix(cells, toks)
        if self.recurrent and n != len(cells):
            return 0
        return n if n <= cap else (0 if self.recurrent else cap)

    def _cut(self, slot: SlotCells, n: int) -> int:
        """Keep positions < n of the slot's sequence (its other sequences emptied); 0 if impossible."""
        for sid in range(slot.base + 1, slot.base + self.width):
            self.ctx.seq_rm(sid, -1, -1)
        if n > 0 and self.ctx.seq_rm(slot.base, n, -1) and self.ctx.pos_max(slot.base) == n - 1:
            return n
        self.clear(slot)
        return 0

    def cut_to(self, slot: SlotCells, n: int) -> int:
        """After the drafter kept fewer: the target keeps as many (0 where it cannot cut there)."""
        return self._cut(slot, n)

    def clear(self, slot: SlotCells) -> None:
        """Empty every sequence of the slot."""
        for sid in range(slot.base, slot.base + self.width):
            self.ctx.seq_rm(sid, -1, -1)

    def stash(self, slot: SlotCells) -> None:
        """Save the slot's cells (target and drafter) into the RAM cache, if there is one."""
        toks = slot.tokens
        if self.cache is None or len(toks) == 0 or self.ctx.pos_max(slot.base) != len(toks) - 1:
            return
        drafted = slot.drafter.save_prefix() if slot.drafter is not None else None
        self.cache.put(toks, self.ctx.save_state(slot.base), drafted, self.recurrent)
