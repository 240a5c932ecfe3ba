"""draft-simple: a separate small GGUF with the target's vocabulary proposes the draft.

The drafter keeps its own context in sync with the committed tokens lazily: before drafting it
finds where its KV cells stop matching the history, drops the rest and decodes what is
missing (usually one or two tokens). Each draft token is *sampled* from the mirrored sampler,
so q is known (docs/design.md invariant 8).
"""

from __future__ import annotations

import struct
from typing import Protocol

import numpy as np

from ..kernels.tree_shape import build_tree
from ..llama.context import Context, check_context_args
from ..llama.model import Model
from ..llama.sampling import SamplerParams
from ..types import FlashAttn
from .base import Drafter, DraftGroup, Proposal, TargetRows, common_prefix
from .mirror import MirrorSampler, ProposalBuilder
from .tree import TreeBuilder, TreeProposal, new_tree_rng


class SharedContextOwner(DraftGroup, Protocol):
    """What a drafter needs of the owner of a shared draft context (draft_batch.SharedDraftModel;
    named here, not imported, so draft_batch can build on this module without a cycle)."""

    def close(self) -> None: ...


class DraftModelDrafter(Drafter):
    name = "draft-simple"
    costly = True
    draft_modes = True
    shared: SharedContextOwner | None = None  # set when its context is a batch's shared one (draft_batch.py)

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 sample: bool = True, seed: int = 0, n_max: int | None = None, context: Context | None = None,
                 seq_id: int = 0, observe_batches: bool = True, flash_attn: FlashAttn = "auto") -> None:
        # n_max: this drafter's own draft cap (llama.cpp's --spec-draft-n-max inside a chain whose
        # generator allows more, e.g. ngram-simple,draft-simple); None = the generator's n_max only.
        # context/seq_id: draft in sequence seq_id of a context owned elsewhere (SharedDraftModel,
        # drafters/draft_batch.py); None = a context of its own, made at its first use (a controller
        # that decodes plainly never needs it: 36-173 ms and its KV cells saved), freed by close().
        # observe_batches: decode every target batch as llama.cpp does (its KV shapes, bit for bit);
        # False = only the lazy sync before each draft (a chain member that rarely drafts, say).
        if n_max is not None and not 1 <= int(n_max) <= 64:
            raise ValueError(f"n_max must be in [1, 64], got {n_max}")
        self.n_max_cap = None if n_max is None else int(n_max)
        self.model = model
        self.vocab_size = model.n_vocab
        self._owns_ctx = context is None
        check_context_args(n_ctx, n_batch, n_threads, flash_attn)   # bad arguments raise here, not at first use
        self._ctx_args: dict[str, object] = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, flash_attn=flash_attn)
        self._ctx = context
        self._closed = False
        self.seq_id = int(seq_id)
        self.observe_batches = bool(observe_batches)
        self.mirror = MirrorSampler(model.n_vocab, model, seed)
        self.sample_drafts = sample
        self.collect_topk = False
        self._kv: list[int] = []     # the tokens in seq_id's KV cells, position by position
        # _kv[:_agreed] is known to equal the request's history (append-only): the sync compares
        # only what came after, so each step's comparison is a few tokens, not the whole history.
        self._agreed = 0
        self._tree_rng = new_tree_rng(seed)

    @property
    def ctx(self) -> Context:
        """The draft context (its own is made here on first use; ValueError once closed)."""
        if self._ctx is None:
            if self._closed:
                raise ValueError("the draft-simple drafter is closed")
            self._ctx = Context(self.model, **self._ctx_args)  # type: ignore[arg-type]
        return self._ctx

    def prepare(self) -> None:
        """Make the context now, before a timed draft (its making is not a draft's cost)."""
        _ = self.ctx

    def configure(self, params: SamplerParams, seed: int, *, sample: bool = True,
                  collect_topk: bool = False) -> None:
        super().configure(params, seed, sample=sample, collect_topk=collect_topk)
        self.mirror.configure(params)
        self.mirror.reseed(seed)
        self._tree_rng = new_tree_rng(seed)

    # The loop decodes prompt[:-1], then [prompt[-1], drafts..] first (llama-speculative-simple's shapes).
    native_prompt_split = True
    observe_without_target_outputs = True  # its own context only

    def observe(self, tokens: np.ndarray, pos0: int, target: TargetRows) -> None:
        """Decode every target batch (tokens (n,) at pos0..) in this context too, in the same shape,
        last row out: llama.cpp's draft-simple process(); the KV then matches native's bit for bit.
        With observe_batches False nothing happens here: the next draft's sync decodes what is missing."""
        if not self.observe_batches or not self.forget_after(pos0):
            return
        if len(tokens) <= self.ctx.n_batch:
            self.ctx.decode(tokens, np.arange(pos0, pos0 + len(tokens), dtype=np.int32), self.seq_id, "last")
        else:
            self.ctx.prefill(tokens.tolist(), self.seq_id, start_pos=pos0)
        self._kv.extend(int(t) for t in tokens)

    def forget_after(self, pos0: int) -> bool:
        """Drop the cells from pos0 on (the drafter's own single-token steps, rejected drafts);
        False when the KV stops before pos0 (a gap, which should not happen: the lazy sync fills it)."""
        if self._ctx is not None:   # (none yet: no cells)
            self._ctx.rollback(self.seq_id, pos0)
        del self._kv[pos0:]
        self._agreed = min(self._agreed, pos0)  # cells written from pos0 on are compared anew
        return len(self._kv) == pos0

    def sit_out_observes(self) -> None:
        self.observe_batches = False

    def begin(self, prompt: list[int]) -> None:
        # Lazy: the first draft() syncs the KV with the history, keeping any common prefix.
        self._agreed = 0

    def begin_prefix(self, prompt: list[int], n_kept: int) -> int:
        """Keep the cells of the common prefix of the KV and prompt[:n_kept]; whatever is missing
        up to n_kept is decoded by the lazy sync before the first draft, so all n_kept are kept."""
        c = common_prefix(self._kv, prompt[:n_kept])
        if self._ctx is not None:
            self._ctx.rollback(self.seq_id, c)
        del self._kv[c:]
        self._agreed = c
        return n_kept

    def save_prefix(self) -> bytes | None:
        """The KV's tokens (int64 count, int32 ids) and its sequence state (None: no context yet)."""
        if self._ctx is None:
            return None
        toks = np.asarray(self._kv, dtype=np.int32)
        return struct.pack("<q", len(toks)) + toks.tobytes() + self.ctx.save_state(self.seq_id)

    def load_prefix(self, data: bytes | None) -> None:
        if self._ctx is not None:
            self._ctx.seq_rm(self.seq_id, -1, -1)
        self._kv = []
        self._agreed = 0
        if data is None:
            return
        (n,) = struct.unpack_from("<q", data)
        self.ctx.load_state(data[8 + 4 * n:], self.seq_id)
        self._kv = np.frombuffer(data, dtype=np.int32, count=n, offset=8).tolist()

    def kept_prefix(self, history: list[int]) -> int:
        """The longest prefix of history[:-1] the KV holds (does not touch the KV). requires:
        history extends the one of the last sync in this request (it only grows)."""
        kv = self._kv
        n = min(len(kv), len(history) - 1)
        a = min(self._agreed, n)
        return a + common_prefix(kv[a:n], history[a:n])

    def sync_plan(self, history: list[int]) -> tuple[int, list[int]]:
        """Drop the cells past ``kept_prefix(history)``; return (c, todo): todo = history[c:] must
        be decoded at c.. (usually one token) before drafting; the caller appends it to the KV."""
        c = self.kept_prefix(history)
        # roll back even when c == len(kv): a decode interrupted (Ctrl-C) may have left cells past kv
        if self._ctx is not None:
            self._ctx.rollback(self.seq_id, c)
        del self._kv[c:]
        self._agreed = len(history)  # once todo is in; min(_, len(kv)) covers a decode that failed
        return c, history[c:]

    def sync_need(self, history: list[int]) -> int | None:
        """len(history) - ``kept_prefix(history)``: what the lazy sync decodes."""
        return len(history) - self.kept_prefix(history)

    def _sync(self, history: list[int]) -> np.ndarray:
        """Make the KV hold history[:-1] + decode history[-1]; return its logits row."""
        c, todo = self.sync_plan(history)
        row = self.ctx.prefill(todo, self.seq_id, start_pos=c)
        self._kv.extend(todo)
        return row

    def new_builder(self, p_min: float) -> ProposalBuilder:
        """The builder of one proposal: q from the mirror, masked like p (DESIGN invariant 3)."""
        return ProposalBuilder(self.mirror, sample=self.sample_drafts, collect_topk=self.collect_topk, p_min=p_min,
                               grammar=self.grammar_clone())

    def cap(self, n_max: int) -> int:
        return n_max if self.n_max_cap is None else min(n_max, self.n_max_cap)

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        n_max = self.cap(n_max)
        build = self.new_builder(p_min)
        row = self._sync(history)
        for i in range(n_max):
            tok = build.add(row)
            if tok is None:
                break
            if i + 1 < n_max:
                row = self.ctx.decode([tok], [len(self._kv)], self.seq_id, "last")[0]
                self._kv.append(tok)
        return build.finish()

    # -- trees (drafters/tree.py) ---------------------------------------------------------------
    def enable_tree(self, shape: tuple[int, ...]) -> None:
        """Before any decode: give the draft context one sequence per path of `shape` (+ seq 0, the
        committed tokens) in a unified KV cache. ValueError if the draft model cannot branch."""
        if not self._owns_ctx:
            raise ValueError("tree: a draft-simple drafter sharing a batch's draft context cannot branch "
                             "(trees run in SpeculativeGenerator, with a drafter of its own)")
        if self.model.is_recurrent or self.model.is_hybrid:
            raise ValueError(f"tree: the draft model {self.model.path} is recurrent/hybrid: a tree needs one "
                             "recurrent state per path, which llama.cpp cannot branch (docs/trees.md)")
        n_seq = build_tree(shape).n_seqs + 1
        if self._ctx is not None and self._ctx.n_seq_max >= n_seq:
            return
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        self._ctx_args.update(n_seq_max=n_seq, kv_unified=True)
        self.prepare()   # now: what llama.cpp refuses for these sequences raises here
        self._kv = []
        self._agreed = 0

    def draft_tree(self, history: list[int], shape: tuple[int, ...], p_min: float) -> TreeProposal:
        """A tree proposal of `shape` continuing `history`: one draft batch per depth, each node in
        the sequences (1 ..) of the full shape's paths through it; seq 0 is left as it was."""
        build = TreeBuilder(self.mirror, shape, self._tree_rng, sample=self.sample_drafts,
                            collect_topk=self.collect_topk, p_min=p_min)
        frontier = [(0, self._sync(history))]
        pos0, n_seq = len(history) - 1, build.full.n_seqs
        for s in range(1, n_seq + 1):
            self.ctx.seq_cp(0, s)
        try:
            for d, width in enumerate(shape):
                new = [i for r, row in frontier for i in build.expand(r, row, width)]
                if not new or d + 1 == len(shape):
                    break
                toks = [build.prop.tokens[i] for i in new]
                rows = self.ctx.decode_seq_sets(toks, [pos0 + d + 1] * len(new), build.seq_sets(new, 1), "all")
                frontier = [(i + 1, rows[j]) for j, i in enumerate(new)]
        finally:
            for s in range(1, n_seq + 1):
                self.ctx.seq_rm(s, -1, -1)
        return build.prop

    def draft_group(self) -> DraftGroup | None:
        return self.shared

    def close(self) -> None:
        if self._owns_ctx:
            self._closed = True
            if self._ctx is not None:
                self._ctx.close()
        elif self.shared is not None:  # the first slot to close frees the shared context
            self.shared.close()
