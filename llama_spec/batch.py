"""Batched speculative generation: many sequences (slots) share one target context and its decodes.

Per ``step()`` (docs/design.md words):

1. each newly added sequence is prefilled on its own (its own decodes, chunks of n_batch, its
   seq id) and gets its first token, the target's own sample after the prompt — exactly the
   solo loop's prefill, so its logits do not depend on the other sequences;
2. every running sequence's [last emitted token, d_1 .. d_k] goes into **one** target decode
   (distinct seq ids, positions per sequence; split into several decodes only when the rows
   exceed the context's n_batch);
3. per sequence, in slot order: its drafter observes its rows, ``rules.choose`` and the rule
   decide on its rows' logits (a view), its rejected tail leaves its KV cells / recurrent state
   (``rollback(seq_id)``), its observers see the verification, and its drafter proposes the
   next draft.

draft-simple through :class:`~llama_spec.drafters.draft_batch.DraftSimpleFactory` (what
``llama-spec serve`` uses): the slots' drafters share one draft context and the proposals of every
sequence are drafted together at the end of the step (one draft decode per draft depth), as
llama.cpp's server does; step 3's observe is skipped (or, with ``observe_batches``, one draft
decode for the whole group). Any other
drafter (a factory returning independent drafters) observes and drafts slot by slot.

Each sequence keeps its own target sampler, accept RNG, drafter, stop rules, SpecStats and
rollback, and the same request objects as :class:`SpeculativeGenerator` (``build_request``,
``Emitter``), so with repacking off a sequence emits exactly what it emits run alone
(invariant 11). The target context is not unified: each sequence has its own KV stream of
``n_ctx_per_seq`` cells. A finished or cancelled sequence frees its slot (and its cells) at once.

Threading: a BatchGenerator is built, driven and closed by one thread.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import accept as _accept
from .context import Context
from .drafters.base import Drafter, Proposal
from .drafters.draft_batch import DraftRequest, SharedDraftModel
from .errors import SequenceError
from .model import Model
from .observers import Observer
from .rules import RULE_NAMES, Rule, choose, make_rules
from .sampling import ReasoningBudget, SamplerParams
from .speculative import Emitter, GenerationResult, Request, RequestHost, TokenEvent, build_request
from .stats import N_MAX_LIMIT, SpecStats

__all__ = ["BatchGenerator", "BatchItem", "GenerationRequest", "generate_batch", "stream_batch"]

log = logging.getLogger(__name__)
BatchItem = tuple[int, TokenEvent | GenerationResult]
_PAD = 256  # llama.cpp rounds every sequence's context up to a multiple of 256 cells


@dataclass
class GenerationRequest:
    """One sequence for a batch generator (the fields of SpeculativeGenerator.stream)."""

    prompt: str | list[int]
    sampling: SamplerParams = SamplerParams()
    n_predict: int = 128
    seed: int | None = None
    stop: Sequence[str] = ()
    verify: str | None = None      # None: the default rule ("token")
    n_max: int | None = None
    ignore_eos: bool = False


class _SeqRows:
    """What a drafter's ``observe`` sees of a joint decode: the target, with nextn rows cut to
    one sequence's rows (row0 .. row0 + n of the batch)."""

    def __init__(self, ctx: Context, row0: int) -> None:
        self.ctx, self.row0 = ctx, row0

    def nextn_rows(self, n_rows: int | None = None) -> np.ndarray:
        n = self.ctx.n_outputs - self.row0 if n_rows is None else n_rows
        return self.ctx.nextn_rows(self.row0 + n)[self.row0:]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ctx, name)


@dataclass(eq=False)
class _Seq:
    """One sequence in a slot: its request objects and where its loop stands."""

    rid: int
    slot: int                       # its seq id in the target context
    req: Request
    em: Emitter
    drafter: Drafter | None
    started: bool = False           # prefilled and first token emitted
    pos0: int = 0                   # position of batch[0] (the last emitted token)
    batch: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # int32 (k+1,)
    prop: Proposal = dataclasses.field(default_factory=Proposal)
    t1: float = 0.0                 # end of the prefill


class BatchGenerator:
    """Runs up to ``n_parallel`` requests at once over one target context (see the module docstring).

    ``drafter_factory()`` is called once per slot (None: plain generation). ``n_ctx`` is per
    sequence. ``observers`` watch every request; ``add`` takes per-request observers too.
    ``context_options``: more Context keywords for the target (n_ubatch, flash_attn, type_k, type_v).
    """

    def __init__(self, target: Model, drafter_factory: Callable[[], Drafter] | None = None, *,
                 n_parallel: int = 4, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_max: int = 3, observers: Iterable[Observer] = (),
                 context_options: Mapping[str, Any] | None = None) -> None:
        if not 1 <= int(n_parallel) <= 256:
            raise ValueError(f"n_parallel must be in [1, 256], got {n_parallel}")
        if not 1 <= int(n_max) <= N_MAX_LIMIT:
            raise ValueError(f"n_max must be in [1, {N_MAX_LIMIT}], got {n_max}")
        if n_ctx <= 0 or n_batch <= 0:
            raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        self.model = target
        self.n_parallel, self.n_max, self.n_batch = int(n_parallel), int(n_max), int(n_batch)
        # The solo generator's context, padded as llama.cpp pads it: the same room per sequence.
        self.n_ctx_per_seq = -(-int(n_ctx) // _PAD) * _PAD
        recurrent = bool(target.is_recurrent or target.is_hybrid)
        self.ctx = Context(target, n_ctx=self.n_parallel * self.n_ctx_per_seq, n_batch=self.n_batch,
                           n_threads=n_threads, n_seq_max=self.n_parallel, n_rs_seq=self.n_max if recurrent else 0,
                           **dict(context_options or {}))
        self.drafters: list[Drafter | None] = []
        try:
            self._make_drafters(drafter_factory)
        except BaseException:
            self.close()
            raise
        self.rules: dict[str, Rule] = make_rules()
        self.scratch = _accept.new_scratch(target.n_vocab)  # shared: sequences are verified one at a time
        self.observers: list[Observer] = list(observers)
        self._n_rs = self.ctx.n_rs_seq if recurrent else None
        self._free = list(range(self.n_parallel))
        self._seqs: dict[int, _Seq] = {}        # by request id, in order of arrival
        self._carry: list[BatchItem] = []       # items of a step that raised a SequenceError
        self._errors: collections.deque[SequenceError] = collections.deque()
        self._next_id = 0
        self._pending: list[tuple[_Seq, int]] = []  # (sequence, draft cap) to draft together (shared drafters)
        self.total = SpecStats()

    def _make_drafters(self, factory: Callable[[], Drafter] | None) -> None:
        make_slots = getattr(factory, "make_slots", None)  # DraftSimpleFactory: one shared draft context
        if make_slots is not None:
            made: list[Drafter | None] = list(make_slots(self.n_parallel))
        else:
            made = [factory() if factory is not None else None for _ in range(self.n_parallel)]
        for d in made:
            self.drafters.append(d)
            if d is not None:
                if d.vocab_size and d.vocab_size != self.model.n_vocab:
                    raise ValueError(f"draft vocabulary ({d.vocab_size} tokens) differs from the target's "
                                     f"({self.model.n_vocab})")
                d.prepare_target(self.ctx)

    def close(self) -> None:
        """Free every context (the target's and the drafters')."""
        for d in self.drafters:
            if d is not None:
                d.close()
        self.drafters = []
        self._seqs.clear()
        self.ctx.close()

    # -- requests ---------------------------------------------------------------------------
    def free_slots(self) -> int:
        return len(self._free)

    def has_work(self) -> bool:
        return bool(self._seqs or self._carry or self._errors)

    def add(self, request: GenerationRequest, *, observers: Iterable[Observer] = (), p_min: float = 0.0,
            reasoning_budget: ReasoningBudget | None = None) -> int:
        """Validate a request (ValueError naming the field) and give it a slot; return its id.

        RuntimeError when no slot is free. It starts (prefill) in the next ``step``.
        """
        if not self._free:
            raise RuntimeError(f"no free slot (all {self.n_parallel} are generating)")
        verify = "token" if request.verify is None else request.verify
        if verify not in RULE_NAMES:
            raise ValueError(f"verify must be one of {', '.join(RULE_NAMES)}, got {verify!r}")
        slot = self._free[0]
        host = RequestHost(self.model, self.drafters[slot], self.rules, self.scratch, tuple(self.observers),
                           self.n_max, self.n_ctx_per_seq, self._n_rs)
        req = build_request(host, request.prompt, request.sampling, request.n_predict, request.seed, None, verify,
                            request.n_max, p_min, tuple(request.stop), reasoning_budget, request.ignore_eos,
                            tuple(observers))
        em = Emitter(self.model, req)
        req.v.emit = em.emit
        self._free.pop(0)
        rid = self._next_id
        self._next_id += 1
        self._seqs[rid] = _Seq(rid, slot, req, em, self.drafters[slot])
        return rid

    def cancel(self, request_id: int) -> None:
        """Drop a sequence now: its slot and KV cells are free; an unknown/finished id is ignored."""
        self._carry = [it for it in self._carry if it[0] != request_id]
        s = self._seqs.pop(request_id, None)
        if s is not None:
            self._release(s)

    def _release(self, s: _Seq) -> None:
        self._seqs.pop(s.rid, None)
        self.ctx.seq_rm(s.slot, -1, -1)
        self._free.append(s.slot)
        self._free.sort()

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> list[BatchItem]:
        """One verification for every sequence (a new one: its prefill and first token).

        Returns (request id, TokenEvent) items and, after a sequence's last event, (id,
        GenerationResult). A failing sequence is dropped (slot freed) and SequenceError raised;
        the other sequences' items of that step come with the next call.
        """
        if self._errors:
            raise self._errors.popleft()
        out, self._carry = self._carry, []
        for s in [s for s in self._seqs.values() if not s.started]:
            self._guarded(s, out, self._start, s, out)
        self._draft_pending(out)
        running = sorted((s for s in self._seqs.values() if s.started), key=lambda s: s.slot)
        group: list[_Seq] = []
        n_rows = 0
        for s in running:
            if group and n_rows + len(s.batch) > self.ctx.n_batch:
                self._verify_group(group, out)
                group, n_rows = [], 0
            group.append(s)
            n_rows += len(s.batch)
        if group:
            self._verify_group(group, out)
        self._draft_pending(out)
        if self._errors:
            self._carry = out
            raise self._errors.popleft()
        return out

    def _guarded(self, s: _Seq, out: list[BatchItem], fn: Callable[..., None], *args: Any) -> None:
        """Run one sequence's part of the step; on failure drop it and queue its SequenceError."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            self._fail(s, out, e)

    def _fail(self, s: _Seq, out: list[BatchItem], e: Exception) -> None:
        """Drop a failed sequence (slot freed, its items of this step removed); queue its error."""
        if s.rid in self._seqs:
            self._release(s)
        out[:] = [it for it in out if it[0] != s.rid]
        self._errors.append(SequenceError(s.rid, e))

    def _start(self, s: _Seq, out: list[BatchItem]) -> None:
        """Prefill a new sequence alone and emit its first token (a verification without drafts)."""
        req = s.req
        for ob in req.observers:
            ob.on_request(req.info)
        t0 = time.perf_counter()
        logits = self._prefill(s)
        s.t1 = time.perf_counter()
        req.stats.t_prompt_s = s.t1 - t0
        s.started = True
        v, prop = req.v, Proposal()
        rule = choose(req.rule, self.rules["exact-match"], prop, req.sampler, req.switch)
        v.begin(len(req.prompt) - 1, np.asarray(req.prompt[-1:], dtype=np.int32), logits, prop, rule.name, 0, True)
        rule.verify(v)
        self._after_verify(s, out)

    def _prefill(self, s: _Seq) -> np.ndarray:
        """Decode the prompt into the sequence's cells as the solo loop does (chunks of n_batch,
        last token's logits); returns those logits, (1, n_vocab)."""
        toks = np.asarray(s.req.prompt, dtype=np.int32)
        self.ctx.seq_rm(s.slot, -1, -1)
        if s.drafter is not None:
            s.drafter.begin(s.req.prompt)
        logits = np.empty((0, self.model.n_vocab), dtype=np.float32)
        for off in range(0, len(toks), self.n_batch):
            chunk = toks[off: off + self.n_batch]
            logits = self.ctx.decode(chunk, np.arange(off, off + len(chunk), dtype=np.int32), s.slot, "last")
            if s.drafter is not None:
                s.drafter.observe(chunk, off, self.ctx)
        if s.drafter is not None:
            s.drafter.snapshot_prompt(len(toks) - 1)
        return logits

    def _verify_group(self, group: list[_Seq], out: list[BatchItem]) -> None:
        """One target decode for the group's [last token + drafts] rows, then each sequence's rule."""
        tokens = np.concatenate([s.batch for s in group])
        pos = np.concatenate([np.arange(s.pos0, s.pos0 + len(s.batch), dtype=np.int32) for s in group])
        seq_ids = np.concatenate([np.full(len(s.batch), s.slot, dtype=np.int32) for s in group])
        logits = self.ctx.decode_multi(tokens, pos, seq_ids, "all")   # (rows, n_vocab), batch order
        self._observe_shared(group)
        row0 = 0
        for s in group:
            n = len(s.batch)
            self._guarded(s, out, self._verify_one, s, logits[row0: row0 + n], row0, out)
            row0 += n

    def _verify_one(self, s: _Seq, logits: np.ndarray, row0: int, out: list[BatchItem]) -> None:
        """The solo loop's verification on this sequence's rows (logits: (k+1, n_vocab) view)."""
        req, v = s.req, s.req.v
        if s.drafter is not None and _shared(s.drafter) is None:
            s.drafter.observe(s.batch, s.pos0, _SeqRows(self.ctx, row0))  # type: ignore[arg-type]
        rule = choose(req.rule, self.rules["exact-match"], s.prop, req.sampler, req.switch)
        v.begin(s.pos0, s.batch, logits, s.prop, rule.name, len(s.em.tokens), False)
        n_acc = rule.verify(v)
        # Rejected drafts leave no trace: keep [.., last emitted before, kept drafts].
        self.ctx.rollback(s.slot, s.pos0 + n_acc + 1)
        if s.drafter is not None:
            s.drafter.accepted(n_acc)
        self._after_verify(s, out)

    def _after_verify(self, s: _Seq, out: list[BatchItem]) -> None:
        """Observers, events; then finish the sequence or draft its next verification."""
        req, em = s.req, s.em
        for ob in req.observers:
            ob.on_verify(req.v)
        out.extend((s.rid, ev) for ev in em.take_events())
        if em.stop_reason is None:
            s.pos0 = len(em.history) - 1  # position of the last emitted token (not yet decoded)
            room = self.n_ctx_per_seq - 1 - s.pos0
            if room < 0:
                em.stop_reason = "context_full"
            else:
                k_cap = min(req.n_max, room, req.n_predict - len(em.tokens) - 1)
                if s.drafter is not None and _shared(s.drafter) is not None and k_cap > 0:
                    s.prop, s.batch = Proposal(), np.asarray(em.history[-1:], dtype=np.int32)
                    self._pending.append((s, k_cap))  # drafted with the other slots (_draft_pending)
                    return
                s.prop = self._propose(s, k_cap)
                s.batch = np.asarray([em.history[-1], *s.prop.tokens], dtype=np.int32)
                return
        self._finish(s, out)

    # -- shared draft context (DraftSimpleFactory) -----------------------------------------------
    def _observe_shared(self, group: list[_Seq]) -> None:
        """The group's verification rows in every shared draft context, one decode per context."""
        by: dict[int, tuple[SharedDraftModel, list[tuple[Any, np.ndarray, int]]]] = {}
        for s in group:
            sh = _shared(s.drafter)
            if sh is not None and sh.observe_batches:
                by.setdefault(id(sh), (sh, []))[1].append((s.drafter, s.batch, s.pos0))
        for sh, items in by.values():
            try:
                sh.observe_many(items)
            except Exception as e:  # noqa: BLE001 - drafts change speed only: re-sync them next draft
                log.warning("draft decode of a batch failed (%s): the slots' drafts re-sync", e)

    def _draft_pending(self, out: list[BatchItem]) -> None:
        """Draft every queued sequence's next proposal, all slots of a shared context together."""
        pending, self._pending = [s for s in self._pending if s[0].rid in self._seqs], []
        by: dict[int, tuple[SharedDraftModel, list[tuple[_Seq, int]]]] = {}
        for s, k in pending:
            sh = _shared(s.drafter)
            assert sh is not None
            by.setdefault(id(sh), (sh, []))[1].append((s, k))
        for sh, items in by.values():
            reqs = [DraftRequest(s.drafter, s.em.history, k, s.req.p_min) for s, k in items]  # type: ignore[arg-type]
            try:
                props: list[Proposal | Exception] = list(sh.draft_many(reqs))
            except Exception as e:  # noqa: BLE001 - no drafts this step; exactness is unaffected
                log.warning("batched draft failed (%s): this step verifies no drafts", e)
                for r in reqs:
                    r.drafter.forget_after(0)
                props = [Proposal() for _ in reqs]
            for (s, _), prop in zip(items, props, strict=True):
                if isinstance(prop, Exception):
                    self._fail(s, out, prop)
                    continue
                s.prop = prop
                s.batch = np.asarray([s.em.history[-1], *prop.tokens], dtype=np.int32)

    def _propose(self, s: _Seq, k_cap: int) -> Proposal:
        """The slot drafter's proposal, cut to k_cap tokens."""
        if s.drafter is None or k_cap <= 0:
            return Proposal()
        prop = s.drafter.draft(s.em.history, k_cap, s.req.p_min)
        if len(prop) > k_cap:
            for seq in (prop.tokens, prop.q_ids, prop.q_probs, prop.topk_ids, prop.topk_probs):
                if seq is not None:
                    del seq[k_cap:]
        return prop

    def _finish(self, s: _Seq, out: list[BatchItem]) -> None:
        req, em = s.req, s.em
        req.stats.t_decode_s = time.perf_counter() - s.t1
        self.total += req.stats
        res = GenerationResult(text=em.text(), tokens=em.tokens, stop_reason=em.stop_reason or "length",
                               stats=req.stats, prompt_tokens=req.prompt, spec_draft_sample=req.switch,
                               verify=req.rule.name)
        self._release(s)
        for ob in req.observers:
            ob.on_result(res)
        out.append((s.rid, res))

    # -- many prompts -------------------------------------------------------------------------
    def run_batch(self, prompts: Iterable[str | Sequence[int] | GenerationRequest],
                  **kw: Any) -> Iterator[tuple[int, TokenEvent | GenerationResult]]:
        """(prompt index, TokenEvent | GenerationResult) as they come; continuous batching.

        ``kw`` are GenerationRequest fields applied to every prompt given as text/tokens (each
        then runs as ``SpeculativeGenerator.generate(prompt, **kw)`` would); a GenerationRequest
        item is used as it is. Needs an idle generator; stops every sequence on an error.
        """
        if self._seqs:
            raise RuntimeError("run_batch needs an idle BatchGenerator (requests are in flight)")
        reqs = [p if isinstance(p, GenerationRequest) else GenerationRequest(
            prompt=p if isinstance(p, str) else [int(t) for t in p], **kw) for p in prompts]
        queue = collections.deque(enumerate(reqs))
        index: dict[int, int] = {}
        try:
            while queue or self.has_work():
                while queue and self._free:
                    i, r = queue.popleft()
                    try:
                        index[self.add(r)] = i
                    except ValueError as e:
                        raise ValueError(f"prompt {i}: {e}") from e
                for rid, item in self.step():
                    yield index[rid], item
        finally:
            for rid in list(self._seqs):
                self.cancel(rid)
            self._carry.clear()
            self._errors.clear()

    def generate_batch(self, prompts: Iterable[str | Sequence[int] | GenerationRequest],
                       **kw: Any) -> list[GenerationResult]:
        """Every prompt's GenerationResult, in order (see ``run_batch`` for ``kw``)."""
        results: dict[int, GenerationResult] = {}
        for i, item in self.run_batch(prompts, **kw):
            if isinstance(item, GenerationResult):
                results[i] = item
        return [results[i] for i in range(len(results))]

    def stream_batch(self, prompts: Iterable[str | Sequence[int] | GenerationRequest],
                     **kw: Any) -> Iterator[tuple[int, TokenEvent]]:
        """(prompt index, TokenEvent) as the sequences emit them (see ``run_batch``)."""
        for i, item in self.run_batch(prompts, **kw):
            if isinstance(item, TokenEvent):
                yield i, item


def _shared(d: Drafter | None) -> SharedDraftModel | None:
    """The shared draft context a slot drafter belongs to, if any."""
    sh = getattr(d, "shared", None)
    return sh if isinstance(sh, SharedDraftModel) else None


def _build(target: Model, drafter_factory: Callable[[], Drafter] | None, n_parallel: int, n_ctx: int,
           n_threads: int | None, n_max: int) -> BatchGenerator:
    return BatchGenerator(target, drafter_factory, n_parallel=n_parallel, n_ctx=n_ctx, n_threads=n_threads,
                          n_max=n_max)


def generate_batch(target: Model, prompts: Iterable[str | Sequence[int] | GenerationRequest], *,
                   drafter_factory: Callable[[], Drafter] | None = None, n_parallel: int = 4, n_ctx: int = 4096,
                   n_threads: int | None = None, n_max: int = 3, **kw: Any) -> list[GenerationResult]:
    """Run many prompts over one BatchGenerator (built and freed here); results in order."""
    gen = _build(target, drafter_factory, n_parallel, n_ctx, n_threads, n_max)
    try:
        return gen.generate_batch(prompts, **kw)
    finally:
        gen.close()


def stream_batch(target: Model, prompts: Iterable[str | Sequence[int] | GenerationRequest], *,
                 drafter_factory: Callable[[], Drafter] | None = None, n_parallel: int = 4, n_ctx: int = 4096,
                 n_threads: int | None = None, n_max: int = 3, **kw: Any) -> Iterator[tuple[int, TokenEvent]]:
    """The streaming form of :func:`generate_batch`: (prompt index, TokenEvent)."""
    gen = _build(target, drafter_factory, n_parallel, n_ctx, n_threads, n_max)
    try:
        yield from gen.stream_batch(prompts, **kw)
    finally:
        gen.close()
