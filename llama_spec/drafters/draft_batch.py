"""draft-simple for a batch: the slots' drafters share one draft context and its decodes.

A BatchGenerator with one DraftModelDrafter per slot decodes the draft model slot by slot:
(k + 1) * n_slots small decodes per step. llama.cpp's server drafts as here instead
(common/speculative.cpp, draft-simple): ``process()`` decodes the whole verification batch in the
draft context once, and ``draft()`` decodes the next token of every slot still drafting together,
so a step costs about k + 1 draft decodes whatever the number of slots.

By default (``observe_batches=False``) the verification batch is not decoded again: the cells the
drafter wrote while drafting ([last, d_1 .. d_{k-1}]) already hold the accepted drafts, so the next
sync decodes only what they lack, the new token (and d_k when every draft was accepted), in the
same joint decode as the other slots. That saves the draft model's largest decode per step;
``observe_batches=True`` decodes as llama.cpp's server does.

Words: a **slot drafter** is the DraftModelDrafter of one slot; it drafts in sequence ``slot`` of
the shared context and keeps its own mirror sampler, RNG, grammar clone and KV bookkeeping, so
its proposal is built exactly as its solo drafting builds it (q known, invariant 8). Only the
decode shapes are shared; with repacking off they give the same logits as solo decodes, so a
batched sequence still emits its solo tokens (invariant 11, tests/test_batch.py).

Threading: the SharedDraftModel is used by the thread that drives its BatchGenerator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import numpy as np

from ..llama.context import Context
from ..llama.model import Model
from .base import Drafter, DraftRequest, Proposal
from .draft_model import DraftModelDrafter
from .mirror import ProposalBuilder

__all__ = ["DraftSimpleFactory", "DraftRequest", "SharedDraftModel"]

log = logging.getLogger(__name__)
_PAD = 256  # llama.cpp rounds every sequence's context up to a multiple of 256 cells
_JOINT_SYNC = 16  # a sync of at most this many tokens joins the slots' joint decode; longer ones prefill alone


class SharedDraftModel:
    """One draft context with a sequence per slot, and the slots' DraftModelDrafters over it.

    ``n_ctx`` is per slot (padded to 256 cells as the target's). ``slots[i]`` drafts in
    sequence i; BatchGenerator gives slot i's drafter to its slot i.
    """

    def __init__(self, model: Model, n_slots: int, *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, n_max: int | None = None, observe_batches: bool = False) -> None:
        if not 1 <= int(n_slots) <= 256:
            raise ValueError(f"n_slots must be in [1, 256], got {n_slots}")
        self.model = model
        self.observe_batches = bool(observe_batches)  # BatchGenerator calls observe_many only when True
        self.n_ctx_per_seq = -(-int(n_ctx) // _PAD) * _PAD
        self.ctx = Context(model, n_ctx=int(n_slots) * self.n_ctx_per_seq, n_batch=n_batch, n_threads=n_threads,
                           n_seq_max=int(n_slots))
        self.slots: list[DraftModelDrafter] = []
        for i in range(int(n_slots)):
            d = DraftModelDrafter(model, n_max=n_max, context=self.ctx, seq_id=i)
            d.shared = self
            self.slots.append(d)
        self.n_decodes = 0  # draft decodes run by observe_many / draft_many (for tests and profiles)

    def close(self) -> None:
        """Free the draft context (every slot drafter's close() comes here; idempotent)."""
        self.ctx.close()

    # -- the DraftGroup capability (what the step core calls) -------------------------------------
    def observe_group(self, items: Sequence[tuple[Drafter, np.ndarray, int]]) -> None:
        """observe_many; a failed decode only re-syncs the slots' drafts (drafts change speed only)."""
        try:
            self.observe_many([(self._slot(d), t, p) for d, t, p in items])
        except Exception as e:  # noqa: BLE001 - drafts change speed only: re-sync them next draft
            log.warning("draft decode of a batch failed (%s): the slots' drafts re-sync", e)

    def draft_group(self, reqs: Sequence[DraftRequest]) -> list[Proposal | Exception]:
        """draft_many; when the joint draft fails, no drafts this step (exactness is unaffected)."""
        try:
            return self.draft_many(reqs)
        except Exception as e:  # noqa: BLE001
            log.warning("batched draft failed (%s): this step verifies no drafts", e)
            for r in reqs:
                self._slot(r.drafter).forget_after(0)
            return [Proposal() for _ in reqs]

    def _slot(self, d: Drafter) -> DraftModelDrafter:
        """requires: d is one of ``slots`` (DraftRequest names it by the base type)."""
        return cast(DraftModelDrafter, d)

    def observe_many(self, items: Sequence[tuple[DraftModelDrafter, np.ndarray, int]]) -> None:
        """Each (slot drafter, tokens int32 (n,), pos0) of one verification batch, in one decode:
        what each drafter's ``observe`` does, with only the batch's last row as output.

        On a decode failure the slots' KV bookkeeping is cleared (their next draft re-syncs from
        position 0): drafts only change speed, never what is emitted.
        """
        rows = [(d, t) for d, t, p in items if d.forget_after(p)]
        if not rows:
            return
        try:
            self._decode_joint([d for d, _ in rows], [[int(x) for x in t] for _, t in rows])
        except Exception:
            for d, _ in rows:
                d.forget_after(0)
            raise

    def draft_many(self, reqs: Sequence[DraftRequest]) -> list[Proposal | Exception]:
        """Every request's proposal, drafting all slots together: one decode for the slots' sync
        tokens, then one per draft depth for the slots still drafting.

        requires: each request's drafter is one of ``slots``, at most once. A slot whose proposal
        builder raises (its grammar, say) gets that exception in its place; the others go on.
        """
        n = len(reqs)
        out: list[Proposal | Exception] = [Proposal() for _ in range(n)]
        ds = [self._slot(r.drafter) for r in reqs]
        caps = [d.cap(r.n_max) for d, r in zip(ds, reqs, strict=True)]
        builds: list[ProposalBuilder | None] = [None] * n
        rows: dict[int, np.ndarray] = {}
        joint: list[int] = []      # requests whose sync is a few tokens (the usual case): decoded together
        todos: dict[int, list[int]] = {}
        for i, r in enumerate(reqs):
            if caps[i] <= 0:
                continue
            try:
                builds[i] = ds[i].new_builder(r.p_min)
            except Exception as e:  # noqa: BLE001 - one slot's failure must not stop the others
                out[i] = e
                continue
            c, todos[i] = ds[i].sync_plan(r.history)
            if len(todos[i]) <= _JOINT_SYNC:
                joint.append(i)
            else:  # a new prompt or a gap: prefill it alone (chunks of n_batch)
                rows[i] = ds[i].ctx.prefill(todos[i], ds[i].seq_id, start_pos=c).copy()
                ds[i]._kv.extend(todos[i])
        if joint:
            got = self._decode_joint([ds[i] for i in joint], [todos[i] for i in joint])
            rows.update(zip(joint, got, strict=True))
        depth = 0
        while rows:
            nxt: list[int] = []
            toks: list[int] = []
            for i in sorted(rows):
                b = builds[i]
                assert b is not None
                try:
                    tok = b.add(rows[i])
                except Exception as e:  # noqa: BLE001
                    out[i], builds[i] = e, None
                    continue
                if tok is not None and depth + 1 < caps[i]:
                    nxt.append(i)
                    toks.append(tok)
            rows = {}
            depth += 1
            if nxt:
                rows = dict(zip(nxt, self._decode_joint([ds[i] for i in nxt], [[t] for t in toks]),
                                strict=True))
        for i, b in enumerate(builds):
            if b is not None:
                out[i] = b.finish()
        return out

    def _decode_joint(self, ds: list[DraftModelDrafter], toks: list[list[int]]) -> list[np.ndarray]:
        """Decode toks[j] at the end of ds[j]'s KV, all in one batch (several when over n_batch; a
        longer one alone); return each one's last row (a copy: the view dies with the next decode)."""
        out: list[np.ndarray] = []
        start = 0
        while start < len(ds):
            end, n = start, 0
            while end < len(ds) and (end == start or n + len(toks[end]) <= self.ctx.n_batch):
                n += len(toks[end])
                end += 1
            part = range(start, end)
            tok = np.concatenate([np.asarray(toks[j], dtype=np.int32) for j in part])
            pos = np.concatenate([np.arange(len(ds[j]._kv), len(ds[j]._kv) + len(toks[j]), dtype=np.int32)
                                  for j in part])
            seq = np.concatenate([np.full(len(toks[j]), ds[j].seq_id, dtype=np.int32) for j in part])
            mask = np.zeros(len(tok), dtype=bool)
            mask[np.cumsum([len(toks[j]) for j in part]) - 1] = True
            logits = self.ctx.decode_multi(tok, pos, seq, mask)
            self.n_decodes += 1
            for r, j in enumerate(part):
                out.append(logits[r].copy())
                ds[j]._kv.extend(toks[j])
            start = end
        return out


class DraftSimpleFactory:
    """A drafter factory for draft-simple: ``factory()`` makes a drafter with its own context (for
    SpeculativeGenerator or a chain); ``make_slots(n)``, which BatchGenerator calls when present,
    makes n drafters sharing one draft context (a SharedDraftModel)."""

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_max: int | None = None, observe_batches: bool = False) -> None:
        self.model, self.n_ctx, self.n_batch, self.n_threads, self.n_max = model, n_ctx, n_batch, n_threads, n_max
        self.observe_batches = observe_batches

    def __call__(self) -> Drafter:
        return DraftModelDrafter(self.model, n_ctx=self.n_ctx, n_batch=self.n_batch, n_threads=self.n_threads,
                                 n_max=self.n_max)

    def make_slots(self, n_slots: int) -> list[Drafter]:
        shared = SharedDraftModel(self.model, n_slots, n_ctx=self.n_ctx, n_batch=self.n_batch,
                                  n_threads=self.n_threads, n_max=self.n_max, observe_batches=self.observe_batches)
        return list(shared.slots)
