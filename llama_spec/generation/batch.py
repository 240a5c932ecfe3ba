"""BatchGenerator: the step core (:mod:`llama_spec.generation.core`) with ``n_parallel`` slots.

Every running sequence's verification rows go into one target decode per step; each sequence
keeps its own target sampler, accept RNG, drafter, stop rules, SpecStats and rollback, and the
same request objects as :class:`~llama_spec.generation.solo.SpeculativeGenerator` (``build_request``,
``Emitter``), so with repacking off a sequence emits exactly what it emits run alone (invariant 11).
Everything a solo request can ask for works here too: rules by name or object, trees
(``GenerationRequest(tree=(3, 1, 1))``, the generator built with ``tree=``), adaptive draft length,
grammar-masked q, observers, chains and their gate, the native prompt split.

draft-simple through :class:`~llama_spec.drafters.draft_batch.DraftSimpleFactory` (what
``llama-spec serve`` uses): the slots' drafters share one draft context and the proposals of every
sequence are drafted together at the end of the step (one draft decode per draft depth), as
llama.cpp's server does. Any other factory gives each slot a drafter of its own. Trees need a
drafter of its own per slot (``drafter_factory=lambda: DraftModelDrafter(draft)``).

The target context is not unified (unless trees are on): each sequence has its own KV stream of
``n_ctx_per_seq`` cells. A cancelled sequence frees its slot and its cells at once; a finished one
frees its slot and leaves its cells as the slot's prompt cache.

Threading: a BatchGenerator is built, driven and closed by one thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..drafters.base import Drafter
from ..llama.context import Context
from ..llama.model import Model
from ..llama.sampling import ReasoningBudget
from ..observe.observers import Observer
from ..observe.stats import N_MAX_LIMIT, SpecStats
from ..rules import Rule
from .controller import CostModelSource, SpecController, make_controller
from .core import Item, StepCore
from .request import GenerationRequest, GenerationResult, TokenEvent, build_request

__all__ = ["BatchGenerator", "BatchItem", "GenerationRequest", "SlotFactory", "generate_batch", "stream_batch"]

BatchItem = Item
_PAD = 256  # llama.cpp rounds every sequence's context up to a multiple of 256 cells


@runtime_checkable
class SlotFactory(Protocol):
    """Capability of a drafter factory: ``make_slots(n)`` makes n slot drafters at once (sharing
    one draft context); BatchGenerator calls it instead of ``factory()`` per slot."""

    def make_slots(self, n_slots: int) -> list[Drafter]: ...


class BatchGenerator:
    """Runs up to ``n_parallel`` requests at once over one target context (see the module docstring).

    ``drafter_factory()`` is called once per slot (None: plain generation). ``n_ctx`` is per
    sequence. ``observers`` watch every request; ``add`` takes per-request observers too.
    ``context_options``: more Context keywords for the target (n_ubatch, flash_attn, type_k, type_v).
    tree: the default tree shape, and the largest a request may ask for; adaptive_draft, auto,
    cost_model: as SpeculativeGenerator's (the controller prices a step of B sequences).
    Prompt reuse: a request goes to the free slot whose cells share the longest prefix with its
    prompt and keeps those cells (or copies them from another slot, or from the host-RAM cache of
    ``cache_ram`` MiB, 0 = off): docs/prompt-cache.md.
    """

    def __init__(self, target: Model, drafter_factory: Callable[[], Drafter] | None = None, *,
                 n_parallel: int = 4, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_max: int = 3, observers: Iterable[Observer] = (),
                 context_options: Mapping[str, Any] | None = None, tree: str | Sequence[int] | None = None,
                 adaptive_draft: bool = False, auto: bool | None = None,
                 cost_model: CostModelSource = None, cache_ram: float = 0) -> None:
        if not 1 <= int(n_parallel) <= 256:
            raise ValueError(f"n_parallel must be in [1, 256], got {n_parallel}")
        if not 1 <= int(n_max) <= N_MAX_LIMIT:
            raise ValueError(f"n_max must be in [1, {N_MAX_LIMIT}], got {n_max}")
        if n_ctx <= 0 or n_batch <= 0:
            raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        self.model = target
        self.n_parallel, self.n_batch = int(n_parallel), int(n_batch)
        # The solo generator's context, padded as llama.cpp pads it: the same room per sequence.
        self.n_ctx_per_seq = -(-int(n_ctx) // _PAD) * _PAD
        self.drafters: list[Drafter | None] = []
        try:
            self.drafters = _make_drafters(drafter_factory, self.n_parallel)
            self.core = StepCore(target, self.drafters, n_ctx=self.n_parallel * self.n_ctx_per_seq,
                                 n_ctx_per_seq=self.n_ctx_per_seq, n_batch=self.n_batch, n_threads=n_threads,
                                 n_max=n_max, tree=tree, adaptive_draft=adaptive_draft, observers=observers,
                                 context_options=context_options,
                                 auto=make_controller(auto, cost_model) if drafter_factory is not None else None,
                                 cache_ram=cache_ram)
        except BaseException:
            for d in self.drafters:
                if d is not None:
                    d.close()
            raise

    @property
    def ctx(self) -> Context:
        return self.core.ctx

    @property
    def n_max(self) -> int:
        return self.core.n_max

    @property
    def observers(self) -> list[Observer]:
        return self.core.observers

    @property
    def total(self) -> SpecStats:
        return self.core.total

    @property
    def rules(self) -> dict[str, Rule]:
        return self.core.rules

    @property
    def controller(self) -> SpecController | None:
        """The speculation controller (None: auto off, or plain generation)."""
        return self.core.auto

    def close(self) -> None:
        """Free every context (the target's and the drafters')."""
        self.core.close()
        self.drafters = []

    # -- requests ---------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.n_parallel - self.core.n_active()

    def cache_info(self) -> dict[str, Any]:
        """The host-RAM prompt cache: limit/size in bytes (its own count), entries, hits, misses, evictions."""
        c = self.core.prompt_cache
        if c is None:
            return {"limit_bytes": 0, "size_bytes": 0, "entries": 0, "hits": 0, "misses": 0, "evictions": 0}
        return {"limit_bytes": c.limit, "size_bytes": c.size, "entries": len(c), "hits": c.hits,
                "misses": c.misses, "evictions": c.evictions}

    def has_work(self) -> bool:
        return self.core.has_work()

    def slot_of(self, request_id: int) -> int:
        """The slot a running request occupies (its seq id in the target context, without trees)."""
        return self.core.slot_of(request_id)

    def add(self, request: GenerationRequest, *, observers: Iterable[Observer] = (), p_min: float | None = None,
            reasoning_budget: ReasoningBudget | None = None) -> int:
        """Validate a request (ValueError naming the field) and give it a slot; return its id.

        RuntimeError when no slot is free. It starts (prefill) in the next ``step``. observers,
        p_min and reasoning_budget add to (or override) the request's own fields.
        """
        prompt = request.prompt
        if isinstance(prompt, str):   # tokenized once: the slot is chosen by its prefix
            prompt = self.model.tokenize(prompt)
        slot = self.core.free_slot(prompt if isinstance(prompt, list) and request.cache_prompt else None)
        if slot is None:
            raise RuntimeError(f"no free slot (all {self.n_parallel} are generating)")
        verify = "token" if request.verify is None else request.verify  # a name is checked by build_request
        req = build_request(self.core.host(slot), prompt, request.sampling, request.n_predict, request.seed,
                            request.spec_draft_sample, verify, request.n_max,  # type: ignore[arg-type]
                            request.p_min if p_min is None else p_min, tuple(request.stop),
                            reasoning_budget or request.reasoning_budget, request.ignore_eos,
                            (*request.observers, *observers), request.cache_prompt)
        req.tree = self.core.request_tree(request.tree, slot, req.rule, req.switch)
        return self.core.add(req, slot)

    def cancel(self, request_id: int) -> None:
        """Drop a sequence now: its slot and KV cells are free; an unknown/finished id is ignored."""
        self.core.cancel(request_id)

    def step(self) -> list[BatchItem]:
        """One verification for every sequence (a new one: its prefill and first token).

        Returns (request id, TokenEvent) items and, after a sequence's last event, (id,
        GenerationResult). A failing sequence is dropped (slot freed) and its SequenceError raised
        by the next call, after this step's other items were returned.
        """
        return self.core.step()

    # -- many prompts -------------------------------------------------------------------------
    def run_batch(self, prompts: Iterable[str | Sequence[int] | GenerationRequest],
                  **kw: Any) -> Iterator[tuple[int, TokenEvent | GenerationResult]]:
        """(prompt index, TokenEvent | GenerationResult) as they come; continuous batching.

        ``kw`` are GenerationRequest fields applied to every prompt given as text/tokens (each
        then runs as ``SpeculativeGenerator.generate(prompt, **kw)`` would); a GenerationRequest
        item is used as it is. Needs an idle generator; stops every sequence on an error.
        """
        if self.core.n_active():
            raise RuntimeError("run_batch needs an idle BatchGenerator (requests are in flight)")
        reqs = [p if isinstance(p, GenerationRequest) else GenerationRequest(
            prompt=p if isinstance(p, str) else [int(t) for t in p], **kw) for p in prompts]
        queue = collections.deque(enumerate(reqs))
        index: dict[int, int] = {}
        try:
            while queue or self.has_work():
                while queue and self.free_slots():
                    i, r = queue.popleft()
                    try:
                        index[self.add(r)] = i
                    except ValueError as e:
                        raise ValueError(f"prompt {i}: {e}") from e
                for rid, item in self.step():
                    yield index[rid], item
        finally:
            for rid in self.core.active_ids():
                self.cancel(rid)
            self.core.clear_errors()

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


def _make_drafters(factory: Callable[[], Drafter] | None, n: int) -> list[Drafter | None]:
    """One drafter per slot: a SlotFactory's shared slots, or factory() per slot (None: plain)."""
    if isinstance(factory, SlotFactory):
        return list(factory.make_slots(n))
    out: list[Drafter | None] = []
    try:
        for _ in range(n):
            out.append(factory() if factory is not None else None)
    except BaseException:
        for d in out:
            if d is not None:
                d.close()
        raise
    return out


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
