"""The public drafter interface: what every drafter hands the verifier, and how the loop drives it.

A **proposal** is the draft tokens plus, per token, q over the drafter's **support** (the set it
sampled from). A drafter that cannot say which distribution it drew from (an n-gram lookup, say)
returns a proposal with ``q_ids is None``: that verification then uses the exact-match rule.

Only :meth:`Drafter.draft` must be overridden; every other hook has a working default. See
docs/drafters.md for two complete, tested examples.

The required core is ``draft`` (and ``accepted``, ``configure``, ``observe``, ``close`` with
defaults). Capabilities are *declared* and checked once, when a generator is built, never probed
per verification:

* :class:`~llama_spec.drafters.tree.TreeDrafting` (``enable_tree`` + ``draft_tree``): the drafter drafts trees;
* ``draft_group()`` returning a :class:`DraftGroup`: slot drafters of one shared draft context,
  drafted together by a batch (draft-simple through ``DraftSimpleFactory``);
* flags: ``native_prompt_split``, ``observe_without_target_outputs`` (prompt snapshots), ``costly``
  (a model member a chain may gate);
* prompt-prefix reuse: ``begin_prefix`` (what of its state a new prompt keeps; the default keeps
  nothing) and ``save_prefix``/``load_prefix`` (its state in the host-RAM prompt cache).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # annotations only: the base stays importable without the compiled binding
    from ..llama.context import Context
    from ..llama.grammar import GrammarState
    from ..llama.sampling import SamplerParams

TOPK_WIDTH = 8  # candidates remembered per draft position for the top-k statistics


@dataclass
class Proposal:
    """Draft tokens with, per token, q over the drafter's support (the set it sampled from)."""

    tokens: list[int] = field(default_factory=list)
    q_ids: list[np.ndarray] | None = field(default_factory=list)    # int32 (support,) per position
    q_probs: list[np.ndarray] | None = field(default_factory=list)  # float32 (support,) per position
    # Optional: the drafter's top-8 candidates per position (ids, probs), for draft statistics.
    topk_ids: list[np.ndarray] | None = None
    topk_probs: list[np.ndarray] | None = None
    # q was masked with a clone of the target's grammar state (every draft grammar-valid): the
    # rejection rules stay exact under a grammar; False there means the exact-match fallback.
    q_grammar_masked: bool = False

    is_tree = False   # the declared interface Proposal and TreeProposal share (see TreeProposal)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Draft positions (a chain: its length; a tree: its deepest node's depth)."""
        return len(self.tokens)

    @property
    def has_q(self) -> bool:
        """True when q is usable by the rejection rules (present, one per draft token)."""
        return (
            self.q_ids is not None
            and self.q_probs is not None
            and len(self.q_ids) == len(self.tokens)
            and len(self.q_probs) == len(self.tokens)
        )

    def truncate(self, k: int) -> None:
        """Keep the first k drafts (a prefix of a draft is a draft from the same q)."""
        if len(self.tokens) <= k:
            return
        for seq in (self.tokens, self.q_ids, self.q_probs, self.topk_ids, self.topk_probs):
            if seq is not None:
                del seq[k:]


class TargetRows(Protocol):
    """What ``Drafter.observe`` may read of the target's last decode: one sequence's rows of it."""

    def nextn_rows(self, n_rows: int | None = None) -> np.ndarray:
        """The MTP hidden rows of this sequence's tokens of the decode, (n_rows, n_embd) float32."""
        ...


@dataclass
class DraftRequest:
    """One slot's draft of a batched draft step: continue ``history`` by up to ``n_max`` tokens."""

    drafter: Drafter
    history: list[int]
    n_max: int
    p_min: float


class DraftGroup(Protocol):
    """Capability: slot drafters sharing one draft context, drafted together by a batch."""

    observe_batches: bool  # True: the group decodes every verification batch (observe_group)

    def observe_group(self, items: Sequence[tuple[Drafter, np.ndarray, int]]) -> None:
        """Each (slot drafter, tokens int32 (n,), pos0) of one verification batch, in one decode."""
        ...

    def draft_group(self, reqs: Sequence[DraftRequest]) -> list[Proposal | Exception]:
        """Every request's proposal (a slot's own failure in its place), drafted together."""
        ...


class Drafter:
    """Base class of every drafter, as the speculative loop drives it (one request at a time).

    Per request: ``configure`` -> (``begin`` + ``snapshot_prompt`` | ``restore_prompt``) ->
    repeatedly ``draft`` / ``observe`` / ``accepted``. ``prepare_target`` runs once when the
    generator builds its target context; ``close`` when the generator closes.
    """

    name: str = "custom"
    vocab_size: int = 0            # 0 = unknown: the generator does not check it against the target's
    sample_drafts: bool = True     # False: deterministic drafts, no q (the exact-match rule)
    collect_topk: bool = False     # an observer wants topk_ids/topk_probs in the proposals
    params: SamplerParams | None = None  # the target's sampler settings of the current request
    seed: int = 0
    grammar_source: Callable[[], GrammarState | None] | None = None  # see bind_grammar
    # True: observe() never reads the target context's outputs, so a repeated prompt may skip the
    # target's prefill (restore_prompt + observe of the last token on stale outputs). Opt-in.
    observe_without_target_outputs: bool = False
    # True: with greedy sampling and repacked weights the loop decodes in llama-speculative-simple's
    # batch shapes (prompt[:-1], then [prompt[-1], drafts..]), so greedy text equals the native tool's.
    native_prompt_split: bool = False
    # True: drafting runs a model, at a cost comparable to a target step, so a chain with gate=True
    # may skip this member where it does not pay (chain_gate.py). The n-gram drafters cost ~nothing.
    costly: bool = False
    # True: ``sample_drafts`` may change between drafts (False: argmax drafts without q, verified by
    # exact-match), so the speculation controller may choose the mode per step (its draft modes).
    draft_modes: bool = False

    def configure(self, params: SamplerParams, seed: int, *, sample: bool = True,
                  collect_topk: bool = False) -> None:
        """Before each request: the target's sampler settings, its seed and what the loop wants."""
        self.params = params
        self.seed = int(seed)
        self.sample_drafts = bool(sample)
        self.collect_topk = bool(collect_topk)

    def bind_grammar(self, source: Callable[[], GrammarState | None] | None) -> None:
        """After configure, per request: `source()` returns a fresh clone of the target's grammar
        state now (None: no grammar). A drafter that masks q with it sets q_grammar_masked."""
        self.grammar_source = source

    def grammar_clone(self) -> GrammarState | None:
        """A clone of the target's grammar state at this point of the request, or None."""
        return self.grammar_source() if self.grammar_source is not None else None

    def prepare_target(self, target: Context) -> None:
        """Once, when the generator builds its target context (MTP: turn the nextn rows on)."""

    def begin(self, prompt: list[int]) -> None:
        """A new prompt (not a prompt-cache hit) is about to be prefilled into the target."""

    def observe(self, tokens: np.ndarray, pos0: int, target: TargetRows) -> None:
        """After every target decode of `tokens` (int32 (n,)) at positions pos0 .. pos0 + n - 1;
        `target` gives this sequence's rows of that decode (valid during the call)."""

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        """Propose up to n_max tokens continuing `history` (prompt + every emitted token; the last
        one is not yet decoded by the target). Stop early where the top probability < p_min."""
        raise NotImplementedError(f"{type(self).__name__} must override Drafter.draft()")

    def accepted(self, n_accepted: int) -> None:
        """After a verification: how many tokens of the last proposal were kept."""

    def other_accepted(self, n_accepted: int) -> None:
        """In a chain, after a verification of another member's proposal (llama.cpp's is_other).
        Default: as accepted() (draft-mtp needs every kept count; draft-simple ignores it)."""
        self.accepted(n_accepted)

    def begin_prefix(self, prompt: list[int], n_kept: int) -> int:
        """A new prompt of which the target still holds the first n_kept tokens (prompt-prefix
        reuse); it decodes prompt[n_kept:] next, observed as usual. Keep your state of
        prompt[:n_kept] and return how many leading tokens you can go on from (<= n_kept: the
        target then keeps only those). Default: ``begin(prompt)`` and 0, no reuse."""
        self.begin(prompt)
        return 0

    def save_prefix(self) -> bytes | None:
        """Your state for the host-RAM prompt cache, as bytes (None: nothing to save, or you cannot:
        ``begin_prefix`` then decides what is reused)."""
        return None

    def load_prefix(self, data: bytes | None) -> None:
        """Replace your state by `data` from ``save_prefix()`` of a drafter like you (None: forget
        it); ``begin_prefix`` follows."""

    def snapshot_prompt(self, n_tokens: int) -> None:
        """The target holds the first n_tokens prompt tokens: remember this point."""

    def restore_prompt(self, n_tokens: int) -> None:
        """Go back to the `snapshot_prompt` point (the same prompt is being reused)."""

    def proposer(self) -> str:
        """Who made the last proposal (a chain: its winning member); per-drafter statistics key on it."""
        return self.name

    def prepare(self) -> None:
        """Before a timed draft: make what is made once (draft-simple: its context), so that no
        measured draft cost includes it. Default: nothing."""

    def sit_out_observes(self) -> None:
        """A chain is about to ask others first: do no work in observe() that only pays when this
        drafter drafts every time (draft-simple stops decoding each target batch and syncs lazily)."""

    # -- what the speculation controller asks (generation/controller.py); defaults: one member ---------
    def members(self) -> Sequence[Drafter]:
        """The drafters the controller may ask one by one (a chain: its members; else this one)."""
        return (self,)

    def member_names(self) -> list[str]:
        """Unique names of ``members()``, as ``proposer()`` reports them."""
        return [self.name]

    def draft_member(self, i: int, history: list[int], n_max: int, p_min: float) -> Proposal:
        """``draft()`` by member i alone (a chain skips the others); this drafter: i == 0."""
        return self.draft(history, n_max, p_min)

    def sync_need(self, history: list[int]) -> int | None:
        """Tokens your next ``draft(history)`` decodes before drafting (a model's lazy sync of what it
        missed; at least 1), or None: not known / costs nothing (the controller then estimates it)."""
        return None

    def truncated(self, k: int) -> None:
        """Only the first k drafts of your last proposal are verified (0: none, the step decodes
        without drafts): the next ``accepted(n)`` counts n <= k of them. Default: nothing."""

    def draft_group(self) -> DraftGroup | None:
        """The shared draft context this slot drafter drafts in with others (None: its own)."""
        return None

    def close(self) -> None:
        """Free the drafter's own resources (contexts)."""


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences (prompt reuse compares tokens,
    never hashes)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


def pack_parts(parts: Sequence[bytes | None]) -> bytes:
    """Several optional byte strings as one (a chain's members' saved states)."""
    out = [struct.pack("<q", len(parts))]
    for p in parts:
        out.append(struct.pack("<q", -1 if p is None else len(p)))
        if p is not None:
            out.append(p)
    return b"".join(out)


def unpack_parts(data: bytes) -> list[bytes | None]:
    """The inverse of :func:`pack_parts`."""
    (n,) = struct.unpack_from("<q", data)
    off, out = 8, list[bytes | None]()
    for _ in range(n):
        (k,) = struct.unpack_from("<q", data, off)
        off += 8
        if k < 0:
            out.append(None)
        else:
            out.append(data[off: off + k])
            off += k
    return out
