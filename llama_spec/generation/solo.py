"""SpeculativeGenerator: the step core (:mod:`llama_spec.generation.core`) with one slot.

Per verification (docs/design.md words; the rules are in llama_spec.rules): the drafter proposes
k <= n_max tokens (with q per token when it sampled them); the target decodes [last emitted token,
d_1 .. d_k] in one batch; the rule decides the emitted tokens, each accepted by the target sampler
exactly once (invariant 5); the rejected tail leaves the target's and the drafter's memory; the
observers see what happened. ``drafter=None`` is plain generation with the same sampler: the
reference the speculative modes are tested against.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..drafters.base import Drafter
from ..errors import GeneratorBusyError
from ..llama.context import Context
from ..llama.model import Model
from ..llama.sampling import ReasoningBudget, SamplerParams
from ..observe.observers import Observer
from ..observe.stats import N_MAX_LIMIT, SpecStats
from ..rules import Rule, VerifyName
from .controller import CostModelSource, SpecController, make_controller
from .core import StepCore
from .draft_length import DraftLengthController
from .request import (
    ENV_DRAFT_SAMPLE,
    GenerationResult,
    GenerationStream,
    Request,
    TokenEvent,
    build_request,
    check_n_max,
)

__all__ = ["ENV_DRAFT_SAMPLE", "N_MAX_LIMIT", "GenerationResult", "GenerationStream", "SpecStats",
           "SpeculativeGenerator", "TokenEvent", "VerifyName", "generate"]


class SpeculativeGenerator:
    """Owns the target context and a drafter; runs requests one after another (a batch of one).

    ``observers`` watch every request (``add_observer`` adds more); ``stream``/``generate`` take
    per-request observers too. context_options: more Context keywords for the target (n_ubatch,
    flash_attn, type_k, type_v). tree: the default tree shape of every request. adaptive_draft: cut
    each proposal to the length with the most expected tokens per second (speed only: a prefix of
    a draft is a draft).

    auto (default on; None reads LLAMA_SPEC_AUTO): the speculation controller (controller.py) chooses
    per step plain decoding, the drafter (a chain's member) and the draft length by predicted
    tokens per second; it subsumes adaptive_draft. Speed only: the output distribution is
    unchanged, but with temp > 0 a seeded run repeats token for token only with auto=False, which
    is the fixed configuration exactly. cost_model: a saved model to start from
    (``llama-spec tune --save``; a path, a dict or a CostModel).

    Prompt reuse: a request keeps the KV cells of the longest common prefix of its prompt and
    the previous request's prompt + output (``cache_prompt=False`` per request: decode it all);
    cache_ram (MiB, 0 = off) adds a host-RAM cache of earlier conversations' states, LRU, never
    above that many bytes (docs/prompt-cache.md).
    """

    def __init__(self, target: Model, drafter: Drafter | None = None, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_threads: int | None = None, n_max: int = 3,
                 observers: Iterable[Observer] = (), context_options: Mapping[str, Any] | None = None,
                 tree: str | Sequence[int] | None = None, adaptive_draft: bool = False, auto: bool | None = None,
                 cost_model: CostModelSource = None, cache_ram: float = 0) -> None:
        check_n_max(n_max)
        self.model = target
        self.drafter = drafter
        self.core = StepCore(target, [drafter], n_ctx=n_ctx, n_ctx_per_seq=None, n_batch=n_batch,
                             n_threads=n_threads, n_max=n_max, tree=tree, adaptive_draft=adaptive_draft,
                             observers=observers, context_options=context_options, isolate_failures=False,
                             auto=make_controller(auto, cost_model) if drafter is not None else None,
                             cache_ram=cache_ram)
        self._owner_lock = threading.Lock()
        self._owner: tuple[int, object] | None = None   # (thread id, token) of the request that owns the loop

    # the core's parts, under the names callers have used
    @property
    def ctx(self) -> Context:
        return self.core.ctx

    @property
    def n_max(self) -> int:
        return self.core.n_max

    @property
    def tree(self) -> tuple[int, ...] | None:
        return self.core.tree

    @property
    def recurrent(self) -> bool:
        return self.core.recurrent

    @property
    def observers(self) -> list[Observer]:
        return self.core.observers

    @property
    def total(self) -> SpecStats:
        return self.core.total

    @property
    def draft_length(self) -> DraftLengthController | None:
        return self.core.draft_length

    @property
    def rules(self) -> dict[str, Rule]:
        return self.core.rules

    @property
    def controller(self) -> SpecController | None:
        """The speculation controller (None: auto off, or no drafter)."""
        return self.core.auto

    def close(self) -> None:
        self.core.close()

    def add_observer(self, observer: Observer) -> Observer:
        """Watch every later request; returns the observer."""
        self.core.observers.append(observer)
        return observer

    def remove_observer(self, observer: Observer) -> None:
        self.core.observers.remove(observer)

    # ------------------------------------------------------------------------------------------
    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        sampling: SamplerParams | None = None,
        n_predict: int = 128,
        seed: int | None = None,
        spec_draft_sample: bool | None = None,
        verify: VerifyName | Rule = "token",
        n_max: int | None = None,
        p_min: float = 0.0,
        stop: Sequence[str] = (),
        reasoning_budget: ReasoningBudget | None = None,
        ignore_eos: bool = False,
        observers: Iterable[Observer] = (),
        result: list[GenerationResult] | None = None,
        tree: str | Sequence[int] | None = None,
        cache_prompt: bool = True,
    ) -> GenerationStream:
        """Validate the request now; return a stream of TokenEvent (``.result`` after iteration).

        verify: the rule ("token" default, "block", "exact-match", or a Rule object);
        spec_draft_sample=False (or LLAMA_ARG_SPEC_DRAFT_SAMPLE=0) forces exact-match.
        ``result`` (a list the GenerationResult is appended to) is kept for older callers.
        """
        token = self._acquire()  # before the request touches the drafter: another thread's may be running
        try:
            req = build_request(self.core.host(0), prompt, sampling, n_predict, seed, spec_draft_sample, verify,
                                n_max, p_min, stop, reasoning_budget, ignore_eos, observers, cache_prompt)
            req.tree = self.core.request_tree(tree, 0, req.rule, req.switch)
            out = GenerationStream()
        except BaseException:
            self._release(token)
            raise
        out._it = self._exclusive(self._run(req, out, result), token)
        out._release = lambda: self._release(token)
        return out

    # -- one user at a time ---------------------------------------------------------------------
    def _acquire(self) -> object:
        """Own the generator for a new request: GeneratorBusyError while another thread's request
        runs; a newer request of the same thread supersedes its older stream."""
        me, token = threading.get_ident(), object()
        self.ctx._check_usable()  # a lost RPC server: its error, not "busy" (the lost call's thread never returns)
        with self._owner_lock:
            if self._owner is not None and self._owner[0] != me:
                raise GeneratorBusyError(
                    "this SpeculativeGenerator is running a request of another thread (use one generator per "
                    "thread; they can share the Model), or a stream of that thread was not closed")
            self._owner = (me, token)
        return token

    def _release(self, token: object) -> None:
        with self._owner_lock:
            if self._owner is not None and self._owner[1] is token:
                self._owner = None

    def _exclusive(self, it: Generator[TokenEvent, None, None], token: object) -> Iterator[TokenEvent]:
        """`it` while `token` owns the generator; a superseded stream stops with GeneratorBusyError."""
        try:
            while True:
                # checked before `it` resumes: a superseded loop must not touch the contexts again
                if self._owner is None or self._owner[1] is not token:
                    raise GeneratorBusyError("a newer request on this generator superseded this stream")
                try:
                    ev = next(it)
                except StopIteration:
                    return
                yield ev
        finally:
            it.close()
            self._release(token)

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> GenerationResult:
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def _run(self, req: Request, out: GenerationStream,
             result: list[GenerationResult] | None) -> Generator[TokenEvent, None, None]:
        """The request's steps in the core's one slot (steps run only while the stream is read)."""
        core = self.core
        for old in core.active_ids():   # a superseded stream of this thread: its sequence ends here
            core.cancel(old, keep_cells=True)
        rid = core.add(req, 0)
        done = False
        try:
            while not done:
                for _, item in core.step():
                    if isinstance(item, GenerationResult):
                        out.result, done = item, True
                        if result is not None:
                            result.append(item)
                    else:
                        yield item
        finally:
            core.cancel(rid, keep_cells=True)  # a stream closed between steps: cells stay consistent


def generate(target: Model, prompt: str | Sequence[int], *, drafter: Drafter | None = None,
             sampling: SamplerParams | None = None, n_predict: int = 128, seed: int | None = None,
             spec_draft_sample: bool | None = None, verify: VerifyName = "token", n_max: int = 3,
             p_min: float = 0.0, stop: Sequence[str] = (), reasoning_budget: ReasoningBudget | None = None,
             n_ctx: int = 4096, n_threads: int | None = None) -> GenerationResult:
    """One request: build a generator around `target` (and `drafter`), run it, free its context."""
    gen = SpeculativeGenerator(target, drafter, n_ctx=n_ctx, n_threads=n_threads, n_max=n_max)
    try:
        return gen.generate(prompt, sampling=sampling, n_predict=n_predict, seed=seed,
                            spec_draft_sample=spec_draft_sample, verify=verify, n_max=n_max, p_min=p_min,
                            stop=stop, reasoning_budget=reasoning_budget)
    finally:
        gen.ctx.close()
