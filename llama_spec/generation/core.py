"""The step core: N sequences (slots) over one target context; every entry point runs on it.

``SpeculativeGenerator`` is this core with one slot, ``BatchGenerator`` (and so ``llama-spec
serve``) with ``n_parallel``. Per :meth:`StepCore.step` (docs/design.md words):

1. each newly added sequence is prefilled alone (its own decodes, chunks of n_batch, its seq id;
   an identical prompt reuses its slot's cells) and gets its first token, the target's own sample
   after the prompt: a verification without drafts. With llama-speculative-simple's shapes (a
   drafter that declares ``native_prompt_split``, greedy, repacked weights) the prompt's last
   token is decoded with the first drafts instead;
2. every other running sequence's [last emitted token, d_1 .. d_k] (a chain) or [root, nodes] (a
   tree) goes into **one** target decode (split only where the rows exceed n_batch);
3. per sequence, in slot order: its drafter observes its rows, the rule decides on its rows'
   logits (a view), the rejected tail leaves its KV cells / recurrent state, observers see the
   verification, and its next proposal is drafted (drafters of one shared draft context together,
   after every sequence was verified).

Capabilities are declared and checked once, when the core is built: a drafter that can draft
trees implements :class:`~llama_spec.drafters.tree.TreeDrafting`; slot drafters of one shared
draft context return it from ``draft_group()``. The step core never probes a drafter or proposal.

Seq ids: slot i owns seq ids [i * width, (i + 1) * width), width = the paths of the largest tree
the core was built for (1 without trees); its committed tokens live in seq i * width.

Threading: a core is built, driven and closed by one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..drafters.base import Drafter, DraftGroup, DraftRequest, Proposal
from ..drafters.tree import TreeDrafting, TreeProposal
from ..errors import SequenceError
from ..kernels import token as _accept
from ..kernels.warmup import warm_up_in_background
from ..llama.context import Context
from ..llama.model import Model
from ..observe.observers import Observer
from ..observe.stats import SpecStats
from ..rules import Rule, choose, make_rules
from ..rules.tree import TreeRule
from .bands import RequestView, band_of, draft_modes_band
from .controller import SpecController
from .draft_length import DraftLengthController
from .plan_driver import keep, run_plan, set_mode
from .prefix import PrefixReuse, SlotCells
from .prompt_cache import PromptCache, common_prefix
from .request import Emitter, GenerationResult, Request, RequestHost, TokenEvent, check_n_max
from .tree import check_tree, commit_tree, propose_tree, tree_n_seqs, tree_rows

__all__ = ["Item", "StepCore"]

Item = tuple[int, TokenEvent | GenerationResult]


class SeqRows:
    """One sequence's rows of a joint decode, as its drafter's ``observe`` sees the target."""

    def __init__(self, ctx: Context, row0: int, n_rows: int) -> None:
        self.ctx, self.row0, self.n_rows = ctx, row0, n_rows

    def nextn_rows(self, n_rows: int | None = None) -> np.ndarray:
        n = self.n_rows if n_rows is None else n_rows
        return self.ctx.nextn_rows(self.row0 + n)[self.row0:]


@dataclass(eq=False)
class _Slot:
    """What a slot keeps across its requests: its drafter and its prompt cache."""

    index: int
    base: int                                # its first seq id (the committed tokens)
    drafter: Drafter | None
    group: DraftGroup | None                 # the shared draft context its drafter drafts in
    trees: bool                              # its drafter drafts trees (TreeDrafting)
    # the tokens its committed cells hold while it is idle (int32 (n,)): its prompt cache
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    cached_full: tuple[np.ndarray, np.ndarray] | None = None  # (prompt, its last logits (1, n_vocab))
    prop_key: object = None                  # which drafter (a chain's member) made the proposal
    last_full: bool = False                  # its last verification kept every draft


@dataclass(eq=False)
class _Seq:
    """One sequence in a slot: its request objects and where its loop stands."""

    rid: int
    slot: _Slot
    req: Request
    em: Emitter
    started: bool = False           # prefilled (and first token emitted, or first drafts queued)
    pos0: int = 0                   # position of batch[0] (the last emitted token)
    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # int32 (rows,)
    prop: Proposal = field(default_factory=Proposal)
    tree: TreeProposal | None = None  # a tree request's proposal (prop is then empty)
    t1: float = 0.0                 # end of the prefill
    view: RequestView | None = None  # the request as the speculation controller sees it (auto)


class StepCore:
    """Slots over one target context (module docstring). ``drafters[i]`` is slot i's drafter.
    n_ctx: the target context's cells; n_ctx_per_seq: the room of one sequence (= n_ctx for one
    slot). isolate_failures: a sequence's exception drops it and is raised as SequenceError once
    the step's other items are out (batches); False: the exception propagates (solo)."""

    def __init__(self, target: Model, drafters: Sequence[Drafter | None], *, n_ctx: int, n_ctx_per_seq: int | None,
                 n_batch: int, n_threads: int | None, n_max: int, tree: str | Sequence[int] | None = None,
                 adaptive_draft: bool = False, observers: Iterable[Observer] = (),
                 context_options: Mapping[str, Any] | None = None, isolate_failures: bool = True,
                 auto: SpecController | None = None, cache_ram: float = 0) -> None:
        check_n_max(n_max)
        if not cache_ram >= 0:
            raise ValueError(f"cache_ram must be >= 0 MiB (0 = off), got {cache_ram}")
        self.model, self.n_max, self.isolate_failures = target, int(n_max), isolate_failures
        for d in drafters:
            if d is not None and d.vocab_size and d.vocab_size != target.n_vocab:
                raise ValueError(f"draft vocabulary ({d.vocab_size} tokens) differs from the target's "
                                 f"({target.n_vocab})")
        # Rolling back rejected drafts on recurrent/hybrid models restores state snapshots: one
        # per draft position (each can be large on big hybrid models), so size them by n_max.
        self.recurrent = bool(target.is_recurrent or target.is_hybrid)
        trees = [isinstance(d, TreeDrafting) for d in drafters]
        # the default tree shape of every request: checked (ValueError) before any context exists
        self.tree = None if tree is None else check_tree(tree, target, list(drafters), trees)
        self.width = tree_n_seqs(self.tree) if self.tree else 1
        n_slots = len(drafters)
        opts: dict[str, Any] = dict(context_options or {})
        if self.tree:
            opts["kv_unified"] = True  # a node's cell is shared by the paths through it
        if n_slots * self.width > 1:
            opts["n_seq_max"] = n_slots * self.width
        self.ctx = Context(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                           n_rs_seq=self.n_max if self.recurrent else 0, **opts)
        self.n_ctx_per_seq = self.ctx.n_ctx if n_ctx_per_seq is None else int(n_ctx_per_seq)
        self.slots = [_Slot(i, i * self.width, d, d.draft_group() if d is not None else None, trees[i])
                      for i, d in enumerate(drafters)]
        for d in drafters:
            if d is not None:
                d.prepare_target(self.ctx)
        # prompt reuse (prefix.py): every slot's own cells; with cache_ram MiB > 0 a host-RAM cache too
        self.prompt_cache = PromptCache(int(cache_ram * 2**20)) if cache_ram > 0 else None
        self.prefix = PrefixReuse(self.ctx, self.slots, self.width, self.recurrent, self.prompt_cache,
                                  self._cells_of)
        self.scratch = _accept.new_scratch(target.n_vocab)  # shared: sequences are verified one at a time
        self.rules: dict[str, Rule] = make_rules()
        self.tree_rule = TreeRule()
        self.observers: list[Observer] = list(observers)
        # auto: the speculation controller (controller.py) decides plain / drafter / length per step;
        # it subsumes the adaptive draft length. Its drafters sync lazily (they sit out plain steps).
        self.auto = auto if any(d is not None for d in drafters) else None
        if self.auto is not None:
            for i, d in enumerate(drafters):
                if d is not None:
                    d.sit_out_observes()
                    ms = d.members()
                    self.auto.attach(i, d.member_names(), [m.costly for m in ms], [m.draft_modes for m in ms],
                                     next((j for j, m in enumerate(ms) if isinstance(m, TreeDrafting)), None))
        self.draft_length = DraftLengthController() if adaptive_draft and self.auto is None else None
        self.total = SpecStats()
        self._free = list(range(n_slots))
        self._seqs: dict[int, _Seq] = {}        # by request id, in order of arrival
        self._errors: list[SequenceError] = []
        self._pending: list[tuple[_Seq, int]] = []  # (sequence, draft cap): drafted with its group
        self._next_id = 0

    # -- requests ---------------------------------------------------------------------------
    def host(self, slot: int) -> RequestHost:
        """What validating a request for `slot` needs (its drafter gets the request's settings)."""
        return RequestHost(self.model, self.slots[slot].drafter, self.rules, self.scratch, tuple(self.observers),
                           self.n_max, self.n_ctx_per_seq, self.ctx.n_rs_seq if self.recurrent else None)

    def request_tree(self, tree: str | Sequence[int] | None, slot: int, rule: Rule | None = None,
                     switch: bool = True) -> tuple[int, ...] | None:
        """A request's tree shape (None: the core's default); ValueError when the context cannot hold it.

        The tree rule generalizes the token rule only: a request verified by another rule (block,
        exact-match, a Rule object; `rule` with the switch on) runs as a chain under it, without
        the default tree, and asking for a tree with it is a ValueError (never silently ignored)."""
        chain_rule = rule if rule is not None and switch and rule is not self.rules["token"] else None
        if tree is None:
            return None if chain_rule is not None else self.tree
        if chain_rule is not None:
            raise ValueError(f"tree: a tree is verified by the tree rule (the token rule's generalization), "
                             f"not by the {chain_rule.name!r} rule: ask for verify='token' with a tree, or no tree")
        d = self.slots[slot].drafter
        shape = check_tree(tree, self.model, [d], [self.slots[slot].trees])
        if self.tree is None or tree_n_seqs(shape) > self.width:
            raise ValueError(f"tree: {shape} needs {tree_n_seqs(shape)} sequences in the target context (per slot), "
                             f"this generator has {self.width}: build it with tree=... (a shape at least as large)")
        return shape

    def free_slot(self, prompt: Sequence[int] | None = None) -> int | None:
        """A free slot (None: all busy); for `prompt`, the one whose cells share its longest prefix
        (llama-server's slot prompt similarity), else the one with the fewest cells to lose."""
        if not self._free:
            return None
        if prompt is None:
            return self._free[0]
        toks = np.asarray(prompt, dtype=np.int32)
        return max(self._free, key=lambda i: (common_prefix(self.slots[i].tokens, toks), -len(self.slots[i].tokens), -i))

    def add(self, req: Request, slot: int) -> int:
        """Run `req` (built with ``host(slot)``) in `slot`, which must be free; returns its id."""
        self._free.remove(slot)
        if self.slots[slot].drafter is not None and self.auto is None and not req.sampler.params.greedy:
            warm_up_in_background()   # numba's set-up ahead of the first sampled verification (kernels/warmup.py)
        em = Emitter(self.model, req)
        req.v.emit = em.emit
        rid = self._next_id
        self._next_id += 1
        self._seqs[rid] = _Seq(rid, self.slots[slot], req, em)
        return rid

    def cancel(self, rid: int, *, keep_cells: bool = False) -> None:
        """Drop a sequence now; its slot is free. keep_cells: its cells (and the slot's prompt
        cache) stay valid (a stream closed between steps); else they are removed."""
        s = self._seqs.pop(rid, None)
        if s is None:
            return
        self._pending = [p for p in self._pending if p[0] is not s]
        if not keep_cells:
            self._forget(s.slot)
        elif s.started:
            self._settle(s)
        self._free.append(s.slot.index)
        self._free.sort()

    def _forget(self, slot: _Slot) -> None:
        slot.cached_full = None
        slot.tokens = slot.tokens[:0]
        self.prefix.clear(slot)

    def has_work(self) -> bool:
        return bool(self._seqs or self._errors)

    def n_active(self) -> int:
        return len(self._seqs)

    def clear_errors(self) -> None:
        self._errors.clear()

    def active_ids(self) -> list[int]:
        return list(self._seqs)

    def slot_of(self, rid: int) -> int:
        """The slot (its first seq id: slot * width) a running request occupies."""
        return self._seqs[rid].slot.index

    def close(self) -> None:
        for slot in self.slots:
            if slot.drafter is not None:
                slot.drafter.close()
        self._seqs.clear()
        self.ctx.close()

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> list[Item]:
        """Start the new sequences, verify the others (one target decode per n_batch rows); returns
        (request id, TokenEvent) items and, after a sequence's last event, (id, GenerationResult).

        A failing sequence is dropped; with isolate_failures its SequenceError is raised by the next
        call (after this step's other items are returned). An exception that is not a sequence's
        own (KeyboardInterrupt, a lost backend) drops every sequence and propagates.
        """
        if self._errors:
            raise self._errors.pop(0)
        out: list[Item] = []
        try:
            running = sorted((s for s in self._seqs.values() if s.started), key=lambda s: s.slot.index)
            for s in [s for s in self._seqs.values() if not s.started]:
                self._guarded(s, out, self._start, s, out)
            self._draft_pending(out)
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
        except BaseException:
            for rid in list(self._seqs):
                self.cancel(rid)
            self._pending.clear()
            raise
        return out

    def _guarded(self, s: _Seq, out: list[Item], fn: Callable[..., None], *args: Any) -> None:
        """Run one sequence's part of the step; on its failure drop it (and queue or raise its error)."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            self._fail(s, out, e)

    def _fail(self, s: _Seq, out: list[Item], e: Exception) -> None:
        self.cancel(s.rid)
        out[:] = [it for it in out if it[0] != s.rid]
        if not self.isolate_failures:
            raise e
        self._errors.append(SequenceError(s.rid, e))

    # -- prefill and the first token ------------------------------------------------------------
    def _start(self, s: _Seq, out: list[Item]) -> None:
        req, slot = s.req, s.slot
        for ob in req.observers:
            ob.on_request(req.info)
        t0 = time.perf_counter()
        # llama-speculative-simple's shapes (a drafter that asks for them, no tree, repacked weights as
        # llama.cpp's default): prefill prompt[:-1], then the first verification is [prompt[-1], drafts..]
        # (invariant 12). Without repacking plain generation's prefill is kept: greedy == plain, bitwise (2).
        # Greedy only for now: a seeded temp>0 run diverged at its first token in this mode (issue 15 report).
        native = (slot.drafter is not None and slot.drafter.native_prompt_split and self.model.repack
                  and not req.tree and len(req.prompt) > 1 and req.sampler.params.greedy)
        logits = self._prefill(slot, req, head_only=native)
        s.t1 = time.perf_counter()
        req.stats.t_prompt_s = s.t1 - t0
        s.started, s.pos0 = True, len(req.prompt) - 1
        if native:
            self._next_proposal(s, min(req.n_max, self.n_ctx_per_seq - 1 - s.pos0, req.n_predict - 1))
            return
        # The first token after the prompt is the target's own sample: a verification without drafts.
        assert logits is not None
        prop = Proposal()
        rule = choose(req.rule, self.rules["exact-match"], prop, req.sampler, req.switch)
        req.v.begin(s.pos0, np.asarray(req.prompt[-1:], dtype=np.int32), logits, prop, rule.name, 0, True)
        rule.verify(req.v)
        self._after_verify(s, out)

    def _prefill(self, slot: _Slot, req: Request, head_only: bool = False) -> np.ndarray | None:
        """Decode the prompt as llama-completion does: all of it, last token included, in chunks of
        n_batch with the last token's logits; returns those logits, (1, n_vocab). head_only: as
        llama-speculative-simple, prompt[:-1] only (returns None; the caller decodes the last token).

        Prompt reuse (``req.cache_prompt``, prefix.py): the cells of the longest common prefix with
        the slot's own cells, another slot's or a RAM-cache entry are kept and only the rest is
        decoded (chunks of n_batch from there); ``req.stats.n_cached`` counts the kept tokens. A
        prompt equal to the slot's last freshly prefilled one reuses the saved logits of that
        prefill too, so nothing is decoded and the result is bit-identical (without a drafter, or
        with one whose observe() reads no target outputs).
        """
        prompt = req.prompt
        toks = np.asarray(prompt, dtype=np.int32)
        n_head, seq, drafter, ctx = len(toks) - 1, slot.base, slot.drafter, self.ctx
        full = slot.cached_full
        if (req.cache_prompt and not head_only and full is not None and np.array_equal(full[0], toks)
                and common_prefix(slot.tokens, toks) == len(toks)
                and (drafter is None or drafter.observe_without_target_outputs)
                and ctx.seq_rm(seq, len(toks), -1) and ctx.pos_max(seq) == n_head):
            if drafter is not None:  # what the drafter sees on the other cache path, minus the decode
                drafter.restore_prompt(n_head)
                drafter.observe(toks[-1:], n_head, SeqRows(ctx, 0, 1))
            slot.tokens = toks.copy()
            req.stats.n_cached = len(toks)
            return full[1].copy()
        slot.cached_full = None
        n_kept = self.prefix.keep(slot, toks, req.cache_prompt)
        if drafter is not None:
            m = drafter.begin_prefix(prompt, n_kept)
            if m < n_kept:
                n_kept = self.prefix.cut_to(slot, m)
                if n_kept < m:
                    drafter.begin_prefix(prompt, n_kept)
        req.stats.n_cached = n_kept
        end = n_head if head_only else len(toks)
        logits = None
        for off in range(n_kept, end, ctx.n_batch):
            logits = self._decode_alone(slot, toks[off: min(off + ctx.n_batch, end)], off)
        if drafter is not None:
            drafter.snapshot_prompt(n_head)
        slot.tokens = toks[:end].copy()
        if logits is not None and not head_only:
            slot.cached_full = (toks.copy(), np.array(logits, dtype=np.float32, copy=True))
        if self.recurrent and n_kept < end:
            self.prefix.stash(slot)  # a checkpoint: a recurrent state cannot be cut back to here later
        return logits

    def _cells_of(self, slot: SlotCells) -> np.ndarray:
        """The tokens a slot's committed cells hold now (prefix.py's cells)."""
        for s in self._seqs.values():
            if s.slot is slot and s.started:
                n = min(self.ctx.pos_max(slot.base) + 1, len(s.em.history))
                return np.asarray(s.em.history[:n], dtype=np.int32)
        return slot.tokens

    def _settle(self, s: _Seq) -> None:
        """A sequence leaves its slot with its cells: they hold history[:-1] at most (its last token
        was never decoded); the slot's tokens say which."""
        slot = s.slot
        n = self.prefix.cut_to(slot, min(self.ctx.pos_max(slot.base) + 1, len(s.em.history) - 1))
        if n == 0:
            self._forget(slot)
            return
        slot.tokens = np.asarray(s.em.history[:n], dtype=np.int32)

    def _decode_alone(self, slot: _Slot, tokens: np.ndarray, pos0: int) -> np.ndarray:
        """A prompt chunk of one sequence, last row out; its drafter observes it."""
        logits = self.ctx.decode(tokens, np.arange(pos0, pos0 + len(tokens), dtype=np.int32), slot.base, "last")
        if slot.drafter is not None:
            slot.drafter.observe(tokens, pos0, SeqRows(self.ctx, 0, len(tokens)))
        return logits

    # -- verification ---------------------------------------------------------------------------
    def _verify_group(self, group: list[_Seq], out: list[Item]) -> None:
        """One target decode for the group's rows, then each sequence's rule on its rows."""
        t0 = time.perf_counter()
        logits = self._decode_group(group)
        if self.draft_length is not None:   # a verification batch: its cost
            self.draft_length.record_decode(sum(len(s.batch) for s in group), time.perf_counter() - t0)
        if self.auto is not None:
            self.auto.decoded(sum(len(s.batch) for s in group), len(group), time.perf_counter() - t0)
        self._observe_groups(group)
        row0 = 0
        for s in group:
            n = len(s.batch)
            self._guarded(s, out, self._verify_one, s, logits[row0: row0 + n], row0, out)
            row0 += n

    def _decode_group(self, group: list[_Seq]) -> np.ndarray:
        ctx = self.ctx
        if len(group) == 1 and group[0].tree is None:   # one chain: the solo decode
            s = group[0]
            return ctx.decode(s.batch, np.arange(s.pos0, s.pos0 + len(s.batch), dtype=np.int32), s.slot.base, "all")
        pos: list[np.ndarray] = []
        sets: list[list[int]] = []
        for s in group:
            if s.tree is None:
                pos.append(np.arange(s.pos0, s.pos0 + len(s.batch), dtype=np.int32))
                sets.extend([s.slot.base] for _ in range(len(s.batch)))
            else:
                p, ss = tree_rows(ctx, s.tree, s.pos0, s.slot.base)
                pos.append(p)
                sets.extend(ss)
        tokens = np.concatenate([s.batch for s in group])
        if all(s.tree is None for s in group):
            return ctx.decode_multi(tokens, np.concatenate(pos), np.asarray([x[0] for x in sets], dtype=np.int32),
                                    "all")
        return ctx.decode_seq_sets(tokens, np.concatenate(pos), sets, "all")

    def _observe_groups(self, group: list[_Seq]) -> None:
        """The group's verification rows in every shared draft context that decodes them."""
        by: dict[int, tuple[DraftGroup, list[tuple[Any, np.ndarray, int]]]] = {}
        for s in group:
            g = s.slot.group
            if g is not None and g.observe_batches and s.tree is None:
                by.setdefault(id(g), (g, []))[1].append((s.slot.drafter, s.batch, s.pos0))
        for g, items in by.values():
            g.observe_group(items)

    def _verify_one(self, s: _Seq, logits: np.ndarray, row0: int, out: list[Item]) -> None:
        """One sequence's verification on its rows (logits: (rows, n_vocab) view)."""
        req, v, slot = s.req, s.req.v, s.slot
        drafter = slot.drafter
        t0 = time.perf_counter()
        if s.tree is not None:
            v.begin(s.pos0, s.batch, logits, s.tree, self.tree_rule.name, len(s.em.tokens), False, tree=s.tree)
            n_acc = self.tree_rule.verify(v)
            commit_tree(self.ctx, s.tree, v.tree_outcome.path, s.pos0, slot.base, self.width)
        else:
            if drafter is not None and slot.group is None:
                drafter.observe(s.batch, s.pos0, SeqRows(self.ctx, row0, len(s.batch)))
            rule = choose(req.rule, self.rules["exact-match"], s.prop, req.sampler, req.switch)
            v.begin(s.pos0, s.batch, logits, s.prop, rule.name, len(s.em.tokens), False)
            n_acc = rule.verify(v)
            # Rejected drafts leave no trace: keep [.., last emitted before, kept drafts].
            self.ctx.rollback(slot.base, s.pos0 + n_acc + 1)
            if self.draft_length is not None:
                self.draft_length.record_verify(slot.prop_key, len(s.prop), n_acc)
                slot.last_full = len(s.prop) > 0 and n_acc == len(s.prop)
        if drafter is not None:
            drafter.accepted(n_acc)
        if self.auto is not None:   # its post cost, survival, what was chosen
            at = s.pos0 + n_acc + 1   # the token emitted after the kept drafts (the shadow check)
            hist = s.em.history
            c = self.auto.verified(slot.index, n_acc, len(s.batch), time.perf_counter() - t0,
                                   int(hist[at]) if at < len(hist) and s.tree is None else None)
            if c is not None:
                req.stats.count_auto(c.name, c.k, c.explored)
        self._after_verify(s, out)

    def _after_verify(self, s: _Seq, out: list[Item]) -> None:
        """Observers, events; then finish the sequence or prepare its next verification."""
        req, em = s.req, s.em
        for ob in req.observers:
            ob.on_verify(req.v)
        out.extend((s.rid, ev) for ev in em.take_events())
        if em.stop_reason is None:
            s.pos0 = len(em.history) - 1  # position of the last emitted token (not yet decoded)
            room = self.n_ctx_per_seq - 1 - s.pos0
            if room >= 0:
                self._next_proposal(s, min(req.n_max, room, req.n_predict - len(em.tokens) - 1), room)
                return
            em.stop_reason = "context_full"
        self._finish(s, out)

    # -- drafting ---------------------------------------------------------------------------------
    def _next_proposal(self, s: _Seq, k_cap: int, room: int | None = None) -> None:
        """Draft the sequence's next verification (a tree, a chain, or queued for its draft group)."""
        req, em, slot = s.req, s.em, s.slot
        last = em.history[-1]
        room = self.n_ctx_per_seq - 1 - s.pos0 if room is None else room
        tree_cap = min(room, req.n_predict - len(em.tokens) - 1) if req.tree else 0   # its deepest tree
        s.tree = None
        if req.tree and self.auto is None:  # a tree proposal, verified in the next joint decode (tree.py)
            s.tree = propose_tree(cast(TreeDrafting, slot.drafter), em.history, req.tree, tree_cap, room, req.p_min)
            s.batch = np.asarray([last, *s.tree.tokens], dtype=np.int32)
            return
        if slot.drafter is None or k_cap <= 0:
            s.prop = Proposal()
        elif self.auto is not None:   # (a tree request: plain, a chain or its tree, s.tree set)
            s.prop = self._auto_proposal(s, slot.drafter, k_cap, tree_cap, room)
        elif slot.group is not None:
            s.prop = Proposal()
            self._pending.append((s, k_cap))  # drafted with the other slots of its group (_draft_pending)
        else:
            s.prop = self._cut(slot, slot.drafter.draft(em.history, k_cap, req.p_min), k_cap)
        s.batch = np.asarray([last, *(s.tree if s.tree is not None else s.prop).tokens], dtype=np.int32)

    def _auto_proposal(self, s: _Seq, drafter: Drafter, k_cap: int, tree_cap: int, room: int) -> Proposal:
        """The controller's choice for this step: drafted now, queued for its group, none (plain), or
        a tree of the request's shape (then in s.tree, and the proposal returned is empty)."""
        req, auto = s.req, cast(SpecController, self.auto)
        p = req.sampler.params
        members, history = drafter.members(), s.em.history
        if s.view is None:   # once per request
            auto.begin_request(s.slot.index)
            s.view = RequestView(band_of(p.greedy, p.temp, req.rule.name if req.switch else "exact-match"),
                                 req.n_predict, draft_modes_band(p.greedy, p.temp, req.rule.uses_q, req.switch),
                                 req.switch, req.tree, len(history) - len(s.em.tokens))
        plan = auto.plan(s.slot.index, k_cap, s.view, len(self._seqs), len(history),
                         lambda m: members[m].sync_need(history), tree_cap)
        if s.slot.group is None:   # (trees never have a group: a draft context per slot)
            prop = run_plan(plan, drafter, history, req.p_min, room)
            s.tree = plan.tree_drafted
            return prop
        ask = plan.next_ask()   # a group member drafts with its group, up to the chosen cap
        if ask is None:
            plan.finish(0)
        else:
            set_mode(plan, members[ask[0]], ask[0])
            self._pending.append((s, ask[1]))
        return Proposal()

    def _cut(self, slot: _Slot, prop: Proposal, k_cap: int) -> Proposal:
        """The proposal cut to k_cap tokens (adaptive draft length: to its best prefix)."""
        if self.draft_length is not None and slot.drafter is not None:
            # per drafter (a chain's member) and per "the last verification kept every draft": copying
            # runs of n-gram drafts are kept whole, other drafts fail early (two survival curves)
            slot.prop_key = (slot.drafter.proposer(), slot.last_full)
            k_cap = min(k_cap, self.draft_length.cut(slot.prop_key, len(prop)))
        prop.truncate(k_cap)
        return prop

    def _draft_pending(self, out: list[Item]) -> None:
        """Draft every queued sequence's next proposal, all slots of a shared context together."""
        pending, self._pending = [p for p in self._pending if p[0].rid in self._seqs], []
        by: dict[int, tuple[DraftGroup, list[tuple[_Seq, int]]]] = {}
        for s, k in pending:
            g = s.slot.group
            assert g is not None
            by.setdefault(id(g), (g, []))[1].append((s, k))
        for g, items in by.values():
            reqs = [DraftRequest(cast(Drafter, s.slot.drafter), s.em.history, k, s.req.p_min)
                    for s, k in items]
            t0 = time.perf_counter()
            props = g.draft_group(reqs)
            share = (time.perf_counter() - t0) / len(items)   # a slot's share of the group's draft
            for (s, k), prop in zip(items, props, strict=True):
                if isinstance(prop, Exception):  # that slot's own failure (its grammar, say)
                    self._fail(s, out, prop)
                    continue
                plan = self.auto.current(s.slot.index) if self.auto is not None else None
                if plan is not None:
                    plan.drafted(0, len(prop), share)
                    s.prop = keep(plan, cast(Drafter, s.slot.drafter), prop)
                else:
                    s.prop = self._cut(s.slot, prop, k)
                s.batch = np.asarray([s.em.history[-1], *s.prop.tokens], dtype=np.int32)

    # -- the end ----------------------------------------------------------------------------------
    def _finish(self, s: _Seq, out: list[Item]) -> None:
        """The result; the slot is free, its cells stay (the slot's prompt cache)."""
        req, em = s.req, s.em
        req.stats.t_decode_s = time.perf_counter() - s.t1
        self.total += req.stats
        verify = "tree" if req.tree and req.switch else req.rule.name
        res = GenerationResult(text=em.text(), tokens=em.tokens, stop_reason=em.stop_reason or "length",
                               stats=req.stats, prompt_tokens=req.prompt, spec_draft_sample=req.switch, verify=verify)
        self.cancel(s.rid, keep_cells=True)
        for ob in req.observers:
            ob.on_result(res)
        out.append((s.rid, res))
