"""N-gram drafters: drafts that cost no model call, read from the request's own tokens.

Three of llama.cpp's self-speculative drafters (``common/ngram-map.cpp``, ``common/ngram-mod.cpp``,
``common/speculative.cpp``), with their ``--spec-type`` names and knobs:

* ``ngram-simple`` (prompt lookup): the last n tokens are searched in the history; the tokens that
  followed the most recent earlier occurrence are the draft.
* ``ngram-map-k``: the same key, found through a map from n-gram to the position where it was
  first registered; per key the draft length adapts to how many tokens were kept last time.
* ``ngram-mod``: a pool ``n-gram -> next token`` (shareable by many generators/slots), the draft
  chained through the pool one token at a time; it drafts only when n_min tokens chain.

Every drafter also gives **q**. Its deterministic draft (what llama.cpp proposes) has a one-hot q
and is the exact-match rule's draft; that is used with ``sample=False`` (no q then), for a greedy
target and with ``deterministic=True``. Otherwise (the target samples, temp > 0) each draft token
is *sampled* from the empirical distribution of the matched contexts, with the drafter's own RNG:

    q_i(y) = #{occurrences of the context c_i in the history followed by y} / #{occurrences of c_i}

where c_i is the context at draft position i given the tokens drafted before it: ngram-simple and
ngram-map-k use c_i = (the n-token key, d_1 .. d_{i-1}), the n + i - 1 tokens ending with the
last draft token, counted over the key's occurrences at positions 1 .. L - n - 2 (the newest
``max_matches`` of them) whose next token lies before the last history token; ngram-mod uses the
last n_match tokens of (history, d_1 .. d_{i-1}), counted over every n-gram the pool has learned.
Whether to draft and the length cap are those of the deterministic draft (functions of the
history only); drafting stops early at a context never seen. So d_i is drawn from exactly the q_i
reported, given d_1 .. d_{i-1}, and the rejection rules apply (docs/design.md words). Under a
grammar, q_i is restricted to the tokens a clone of the target's grammar state allows after
d_1 .. d_{i-1} (drafting stops where none is left), so the rules stay exact there too.

Each drafter learns the history incrementally (amortized O(1) per token): an occurrence index
over the tokens it has seen, cut back where a new history diverges from the old one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Drafter, Proposal
from .ngram_index import (
    Choose,
    HistoryIndex,
    NgramPool,
    ProposalParts,
    check_int,
    choose_mode,
    q_arrays,
)

if TYPE_CHECKING:  # annotations only: n-gram drafters need no compiled binding
    from ..llama.grammar import GrammarState
    from ..llama.sampling import SamplerParams

# llama.cpp's --spec-type names, in its order of preference (common_speculative_init).
LLAMA_SPEC_PRIORITY = (
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
    "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
)
NGRAM_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")  # the ones implemented here

# CLI flag -> (spec type, knob of build_ngram_drafter, llama.cpp's default), from common/arg.cpp.
NGRAM_CLI_FLAGS: dict[str, tuple[str, str, int]] = {
    "--spec-ngram-simple-size-n": ("ngram-simple", "size_n", 12),
    "--spec-ngram-simple-size-m": ("ngram-simple", "size_m", 48),
    "--spec-ngram-simple-min-hits": ("ngram-simple", "min_hits", 1),
    "--spec-ngram-map-k-size-n": ("ngram-map-k", "size_n", 12),
    "--spec-ngram-map-k-size-m": ("ngram-map-k", "size_m", 48),
    "--spec-ngram-map-k-min-hits": ("ngram-map-k", "min_hits", 1),
    "--spec-ngram-mod-n-match": ("ngram-mod", "n_match", 24),
    "--spec-ngram-mod-n-min": ("ngram-mod", "n_min", 48),
    "--spec-ngram-mod-n-max": ("ngram-mod", "n_max", 64),
}

MOD_CHUNK = 32            # ngram-mod learns the history in chunks of this many tokens (as llama.cpp)
MOD_LOW_ACCEPT = 0.25     # ngram-mod: kept/drafted below this for MOD_LOW_ROUNDS rounds resets the pool
MOD_LOW_ROUNDS = 5
_RNG_SALT = 0x6E67_7261   # the drafter's RNG is seeded apart from the target's and the accept RNG


class _NgramDrafter(Drafter):
    """What the n-gram drafters share: the mode of a request, the RNG, walks over contexts."""

    observe_without_target_outputs = True  # token ids only
    # llama-speculative-simple's shapes with repacking on (greedy): prompt[:-1], then [prompt[-1], drafts..];
    # without them the greedy text can differ from the native tool's (tests/test_parity_native.py)
    native_prompt_split = True

    def __init__(self, *, deterministic: bool, greedy_pick: str, max_matches: int) -> None:
        if greedy_pick not in ("llama", "mode"):
            raise ValueError(f"greedy_pick must be 'llama' or 'mode', got {greedy_pick!r}")
        self.deterministic = bool(deterministic)
        self.greedy_pick = greedy_pick
        self.max_matches = check_int("max_matches", max_matches, 1, 1 << 20)
        self._rng = np.random.Generator(np.random.PCG64(_RNG_SALT))

    def configure(self, params: SamplerParams, seed: int, *, sample: bool = True,
                  collect_topk: bool = False) -> None:
        super().configure(params, seed, sample=sample, collect_topk=collect_topk)
        self._rng = np.random.Generator(np.random.PCG64((int(seed) & 0xFFFFFFFF) ^ _RNG_SALT))

    def begin_prefix(self, prompt: list[int], n_kept: int) -> int:
        """Token ids are all an n-gram drafter knows: learn the prompt as ``begin`` does, keep every
        cell the target kept."""
        self.begin(prompt)
        return n_kept

    def _sampling(self) -> bool:
        """True when draft tokens are drawn from the empirical q (the target samples)."""
        p = self.params
        return self.sample_drafts and not self.deterministic and p is not None and not p.greedy

    def _choose_sample(self, ids: np.ndarray, counts: np.ndarray) -> int:
        # inverse CDF over the integer counts: exactly q = counts / sum
        u = self._rng.random() * counts.sum()
        return min(int(np.searchsorted(np.cumsum(counts), u, side="right")), len(counts) - 1)

    def _chooser(self) -> Choose | None:
        """How to pick along a walk over contexts; None: the llama.cpp draft (one-hot q)."""
        if self._sampling():
            return self._choose_sample
        return choose_mode if self.greedy_pick == "mode" else None

    @staticmethod
    def _mask(g: GrammarState | None, ids: np.ndarray, cnt: np.ndarray,
              q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q restricted to the tokens the grammar clone `g` allows now (renormalized counts)."""
        if g is None:
            return ids, cnt, q
        ok = g.allowed(ids)
        if ok.all():
            return ids, cnt, q
        ids, cnt = ids[ok], cnt[ok]
        return ids, cnt, (cnt / max(cnt.sum(), 1.0)).astype(np.float32)

    def _det_parts(self, tokens: Sequence[int]) -> Proposal:
        parts = ProposalParts(self.sample_drafts, self.collect_topk)
        for t in tokens:
            parts.add_one_hot(int(t))
        return parts.finish()

    def _walk_history(self, toks: list[int], starts: list[int], n: int, k: int, p_min: float,
                      choose: Choose) -> Proposal:
        """Draft up to k tokens from the continuations of `starts` (occurrences of the key,
        newest first) in `toks`; q_i counts the next tokens of the occurrences still matching."""
        parts = ProposalParts(self.sample_drafts, self.collect_topk)
        g = self.grammar_clone()  # q masked like p under a grammar (advanced by each draft)
        end = len(toks) - 1   # next tokens lie before the last history token (as llama.cpp copies)
        alive = starts
        for i in range(k):
            counts: dict[int, int] = {}
            keep: list[int] = []
            for j in alive:
                c = j + n + i
                if c < end:
                    t = toks[c]
                    counts[t] = counts.get(t, 0) + 1
                    keep.append(j)
            if not counts:
                break
            ids, cnt, q = self._mask(g, *q_arrays(counts))
            if len(ids) == 0 or (p_min > 0.0 and float(q.max()) < p_min):
                break
            x = choose(ids, cnt)
            tok = int(ids[x])
            parts.add(tok, ids, q)
            if g is not None:
                g.accept(tok)
            alive = [j for j in keep if toks[j + n + i] == tok]
        return parts.finish(grammar_masked=g is not None)

    def other_accepted(self, n_accepted: int) -> None:
        """A chain verified another member's proposal (llama.cpp's accept with is_other)."""


class NgramSimpleDrafter(_NgramDrafter):
    """ngram-simple (prompt lookup): continue the newest earlier occurrence of the last n tokens.

    llama.cpp's rule (common_ngram_simple_draft), history H of L tokens: needs L - 1 > n + m + 1;
    the key H[L-n:] is searched at starts j in [1, L - n - 2], newest first; the draft is
    H[j+n : j+n+c] with c = min(m, L - 1 - j - n), and nothing when c < n. ``min_hits`` is
    accepted for the CLI but, as in llama.cpp, unused by this drafter.
    """

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, deterministic: bool = False,
                 greedy_pick: str = "llama", max_matches: int = 256) -> None:
        super().__init__(deterministic=deterministic, greedy_pick=greedy_pick, max_matches=max_matches)
        self.size_n = check_int("size_n", size_n, 1, 1024)
        self.size_m = check_int("size_m", size_m, 1, 1024)
        self.min_hits = check_int("min_hits", min_hits, 1, 1 << 16)
        self.index = HistoryIndex(self.size_n)

    def begin(self, prompt: list[int]) -> None:
        self.index.sync(prompt, full=True)

    def restore_prompt(self, n_tokens: int) -> None:
        self.index.truncate(min(len(self.index), n_tokens))

    def _starts(self, key: tuple[int, ...], L: int) -> list[int]:
        """Occurrences of key at starts <= L - n - 2, newest first (at most max_matches)."""
        lst = self.index.positions(key)
        hi = bisect.bisect_right(lst, L - self.size_n - 2)
        return lst[max(0, hi - self.max_matches) : hi][::-1]

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        n, m = self.size_n, self.size_m
        self.index.sync(history)
        toks, L = self.index.tokens, len(history)
        if L - 1 <= n + m + 1 or n_max <= 0:
            return Proposal()
        starts = self._starts(tuple(toks[L - n :]), L)
        if not starts:
            return Proposal()
        j = starts[0]
        c = min(m, L - 1 - j - n)
        if c < n:
            return Proposal()
        k = min(c, n_max)
        choose = self._chooser()
        if choose is None:
            return self._det_parts(toks[j + n : j + n + k])
        return self._walk_history(toks, starts, n, k, p_min, choose)


class NgramMapDrafter(_NgramDrafter):
    """ngram-map-k: the key's position from a map of first-registered n-grams (llama.cpp's
    common_ngram_map with key_only=true), the draft length capped by the tokens kept last time.

    History H of L tokens, cur = L - 1 (llama.cpp's token list; H[-1] is its `sampled`): needs
    cur >= 2n + m. Starts up to lim = cur - n - m - 1 are registered (newest first, the first
    registration of an n-gram wins) on each draft; the key H[L-n:] is taken from the map when its
    position < lim, else the newest unregistered occurrence (prompt region first). The draft is
    min(m, kept last time from this key; m at first) tokens after it. ``min_hits`` is only used
    by llama.cpp's ngram-map-k4v and accepted here for the CLI.
    """

    name = "ngram-map-k"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, deterministic: bool = False,
                 greedy_pick: str = "llama", max_matches: int = 256) -> None:
        super().__init__(deterministic=deterministic, greedy_pick=greedy_pick, max_matches=max_matches)
        self.size_n = check_int("size_n", size_n, 1, 1024)
        self.size_m = check_int("size_m", size_m, 1, 1024)
        self.min_hits = check_int("min_hits", min_hits, 1, 1 << 16)
        self.index = HistoryIndex(self.size_n)
        self._reset_map(0)

    def _reset_map(self, size_begin: int) -> None:
        self._registered: dict[tuple[int, ...], int] = {}
        self._n_kept: dict[tuple[int, ...], int] = {}   # per key: tokens kept at its last draft
        self._reg_last = 0           # registered up to this start (llama.cpp's key_map_last_idx)
        self._size_begin = size_begin
        self._last_key: tuple[int, ...] | None = None
        self._cut: int | None = None   # the controller's cut of the last draft (truncated)

    def begin(self, prompt: list[int]) -> None:
        self.index.sync(prompt, full=True)
        self._reset_map(max(0, len(prompt) - 1))

    def restore_prompt(self, n_tokens: int) -> None:
        self.index.truncate(min(len(self.index), n_tokens))
        self._reset_map(n_tokens)

    def _newest_in(self, key: tuple[int, ...], lo: int, hi: int) -> int | None:
        lst = self.index.positions(key)
        i = bisect.bisect_right(lst, hi) - 1
        return lst[i] if i >= 0 and lst[i] >= lo else None

    def _register(self, toks: list[int], starts: range) -> None:
        n, reg = self.size_n, self._registered
        for j in starts:
            reg.setdefault(tuple(toks[j : j + n]), j)

    def _match(self, toks: list[int], key: tuple[int, ...], lim: int) -> int | None:
        """The start llama.cpp's map lookup finds for `key`, then registers starts up to lim."""
        n, m, sb, last = self.size_n, self.size_m, self._size_begin, self._reg_last
        pos = self._registered.get(key)
        if pos is not None and not 0 < pos < lim:
            pos = None
        if pos is None and sb > n + m + 1:
            pos = self._newest_in(key, last + 1, sb - n - m - 1)
        if pos is None:
            pos = self._newest_in(key, max(sb, last) + 1, lim)
        if sb > n + m + 1:
            self._register(toks, range(sb - n - m - 1, last, -1))
        self._register(toks, range(lim, max(sb, last), -1))
        self._reg_last = max(lim, last)
        return pos

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        n, m = self.size_n, self.size_m
        self._last_key = None
        old = len(self.index)
        kept = self.index.sync(history)
        if kept < old:   # the history changed under the map (not within a request): start it again
            self._reset_map(min(self._size_begin, kept))
        toks, L = self.index.tokens, len(history)
        cur = L - 1
        if cur < 2 * n + m or n_max <= 0:
            return Proposal()
        key = tuple(toks[L - n :])
        pos = self._match(toks, key, cur - n - m - 1)
        if pos is None:
            return Proposal()
        self._last_key = key
        k = min(m, self._n_kept.setdefault(key, m), n_max)
        if k <= 0:
            return Proposal()
        choose = self._chooser()
        if choose is None:
            return self._det_parts(toks[pos + n : pos + n + k])
        lst = self.index.positions(key)
        hi = bisect.bisect_right(lst, L - n - 2)
        starts = lst[max(0, hi - self.max_matches) : hi][::-1]
        return self._walk_history(toks, starts, n, k, p_min, choose)

    def accepted(self, n_accepted: int) -> None:
        if self._last_key is not None and not (self._cut is not None and n_accepted >= self._cut):
            self._n_kept[self._last_key] = int(n_accepted)   # (a cut draft kept whole says nothing past the cut)
        self._last_key, self._cut = None, None

    def truncated(self, k: int) -> None:
        """The controller verifies k of the drafts: 0 leaves the key's length as it was."""
        if k == 0:
            self._last_key = None
        self._cut = k

    def other_accepted(self, n_accepted: int) -> None:
        self._last_key = None


class NgramModDrafter(_NgramDrafter):
    """ngram-mod: chain through a pool n-gram -> next token (llama.cpp's common_ngram_mod).

    The pool learns the history (a new prompt at begin, then in chunks of 32 tokens); the draft
    looks up the last n_match tokens, appends the answer and looks up again, up to n_max tokens;
    a miss before n_min tokens means no draft. Five rounds in a row keeping < 25 % of the draft
    reset the pool (for every drafter sharing it). Pass the same `pool` to share it.
    """

    name = "ngram-mod"

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48, *, pool: NgramPool | None = None,
                 deterministic: bool = False, greedy_pick: str = "llama") -> None:
        super().__init__(deterministic=deterministic, greedy_pick=greedy_pick, max_matches=1)
        n_match = check_int("n_match", n_match, 1, 1024)
        self.n_max = check_int("n_max", n_max, 0, 1024)
        self.n_min = check_int("n_min", n_min, 0, 1024)
        if pool is not None and pool.n != n_match:
            raise ValueError(f"pool: its n_match={pool.n} differs from n_match={n_match}")
        self.pool = pool if pool is not None else NgramPool(n_match)
        self.n_match = n_match
        self._i_last = 0        # the pool has learned the n-grams starting before this position
        self._gen = self.pool.generation
        self._n_draft_last = 0
        self._n_low = 0
        self._snap = (0, -1)   # (i_last, pool generation) at snapshot_prompt

    def begin(self, prompt: list[int]) -> None:
        pool, n = self.pool, self.n_match
        toks = prompt[:-1]   # llama.cpp's begin sees the prompt without its last token
        self._i_last = self._n_draft_last = 0
        if len(toks) >= n:
            for i in range(len(toks) - n):
                pool.add(toks, i)
            self._i_last = len(toks) - n
            if len(pool) > pool.max_entries:
                pool.reset()
        self._gen = pool.generation

    def snapshot_prompt(self, n_tokens: int) -> None:
        self._snap = (self._i_last, self.pool.generation)

    def restore_prompt(self, n_tokens: int) -> None:
        i_last, gen = self._snap
        # the pool still knows this prompt unless it was reset since: then learn it again
        self._i_last = i_last if gen == self.pool.generation else 0
        self._gen = self.pool.generation
        self._n_draft_last = 0

    def _learn(self, history: list[int]) -> None:
        pool, n = self.pool, self.n_match
        if pool.generation != self._gen:   # another slot reset the shared pool
            self._gen, self._i_last = pool.generation, 0
        cur = len(history) - 1
        if self._i_last + MOD_CHUNK < cur:
            for i in range(self._i_last, cur - n):
                pool.add(history, i)
            self._i_last = cur - n

    def _chain(self, history: list[int], need: int) -> list[int] | None:
        """llama.cpp's draft, `need` tokens at most; None when it misses before n_min."""
        n, last = self.n_match, self.pool.last
        ctx = list(history[len(history) - n :])
        for i in range(need):
            tok = last.get(tuple(ctx[i : i + n]))
            if tok is None:
                if i < self.n_min:
                    return None
                break
            ctx.append(tok)
        return ctx[n:]

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        self._n_draft_last = 0
        n = self.n_match
        if len(history) - 1 < n or n_max <= 0:
            return Proposal()
        self._learn(history)
        k_cap = min(n_max, self.n_max)
        det = self._chain(history, min(self.n_max, max(self.n_min, k_cap)))
        if not det:
            return Proposal()
        k = min(k_cap, len(det))
        choose = self._chooser()
        if choose is None:
            prop = self._det_parts(det[:k])
        else:
            prop = self._walk_pool(history, k, p_min, choose)
        self._n_draft_last = len(prop)
        return prop

    def _walk_pool(self, history: list[int], k: int, p_min: float, choose: Choose) -> Proposal:
        """Draft up to k tokens; q_i = the pool's counts after the last n_match tokens so far."""
        parts = ProposalParts(self.sample_drafts, self.collect_topk)
        g = self.grammar_clone()
        n, counts_of = self.n_match, self.pool.counts
        ctx = list(history[len(history) - n :])
        for i in range(k):
            counts = counts_of.get(tuple(ctx[i : i + n]))
            if not counts:
                break
            ids, cnt, q = self._mask(g, *q_arrays(counts))
            if len(ids) == 0 or (p_min > 0.0 and float(q.max()) < p_min):
                break
            tok = int(ids[choose(ids, cnt)])
            parts.add(tok, ids, q)
            if g is not None:
                g.accept(tok)
            ctx.append(tok)
        return parts.finish(grammar_masked=g is not None)

    def truncated(self, k: int) -> None:
        """The controller verifies k of the drafts: the low-acceptance count sees only those."""
        self._n_draft_last = min(self._n_draft_last, int(k))

    def accepted(self, n_accepted: int) -> None:
        if self._n_draft_last <= 0:
            return
        if n_accepted / self._n_draft_last < MOD_LOW_ACCEPT:
            self._n_low += 1
            if self._n_low >= MOD_LOW_ROUNDS:
                self.pool.reset()
                self._gen = self.pool.generation
                self._n_low = self._i_last = 0
        else:
            self._n_low = 0


# ---------------------------------------------------------------------------------------------
# what the CLI calls

def parse_spec_types(value: str, *, keep_order: bool = False) -> list[str]:
    """``"ngram-mod,draft-simple"`` -> the list of --spec-type names (llama.cpp's names).

    Unknown names raise ValueError; ``none`` anywhere means no speculation ([]). Duplicates are
    dropped. The order is llama.cpp's fixed preference (n-gram drafters before model drafters)
    unless `keep_order`, which keeps the order given.
    """
    if not isinstance(value, str):
        raise ValueError(f"spec_type must be a string, got {value!r}")
    names = [s.strip() for s in value.split(",") if s.strip()]
    out: list[str] = []
    for s in names:
        if s == "none":
            return []
        if s not in LLAMA_SPEC_PRIORITY:
            raise ValueError(f"spec_type: unknown speculative type {s!r} (known: none, {', '.join(LLAMA_SPEC_PRIORITY)})")
        if s not in out:
            out.append(s)
    return out if keep_order else sorted(out, key=LLAMA_SPEC_PRIORITY.index)


def build_ngram_drafter(spec_type: str, **knobs: Any) -> Drafter:
    """An n-gram drafter by its --spec-type name with its knobs (see NGRAM_CLI_FLAGS; defaults
    are llama.cpp's). Extra knobs: deterministic, greedy_pick ('llama' | 'mode'), max_matches
    (ngram-simple/map-k), pool (ngram-mod: an NgramPool shared by several drafters)."""
    if spec_type == "ngram-simple":
        return NgramSimpleDrafter(**knobs)
    if spec_type == "ngram-map-k":
        return NgramMapDrafter(**knobs)
    if spec_type == "ngram-mod":
        return NgramModDrafter(**knobs)
    if spec_type in ("ngram-map-k4v", "ngram-cache"):
        raise ValueError(f"spec_type {spec_type!r} is not implemented (implemented: {', '.join(NGRAM_SPEC_TYPES)})")
    raise ValueError(f"spec_type {spec_type!r} is not an n-gram drafter ({', '.join(NGRAM_SPEC_TYPES)})")
