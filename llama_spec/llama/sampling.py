"""The target sampler: llama.cpp's own sampler chain, turned into p as numpy.

Contract (the words of docs/design.md):

* ``TargetSampler.candidates(logits_row)`` applies, in order, the reasoning budget, the grammar
  and the chain (logit bias, penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC,
  temperature) **without** the final ``dist`` and returns p over the surviving support as two
  contiguous numpy arrays (ids int32, probs float32, softmax in double). On a greedy sampler
  (temp <= 0) p is one-hot on the argmax. The arrays are views of buffers owned by the
  sampler: valid until the next ``candidates``/``sample`` call.
* ``TargetSampler.sample(logits_row)`` is the plain path: the same steps, then ``dist`` (or
  greedy) draws a token from llama.cpp's own RNG. The exact-match rule and plain generation use
  it; the rejection rule never does, so turning that rule on never changes what ``dist`` draws.
* ``TargetSampler.accept(token)`` must be called exactly once per emitted position, in order,
  before the next position's candidates (budget, grammar and penalties depend on it).
* ``clone()`` copies every piece of state (chain, budget, grammar, dist RNG).

Every llama.cpp sampler here (the target's chain, :class:`SamplerChain`, the reasoning budget,
grammar states) is a :class:`~llama_spec._handle.NativeHandle`: freed exactly once by
``close()`` (idempotent; also the context manager and the finalizer), ValueError on any use after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._ffi import ffi, lib
from .._handle import NativeHandle
from .grammar import GrammarState
from .model import Model

__all__ = ["DEFAULT_SEED", "TOKEN_DATA", "CandidateBuffers", "ReasoningBudget", "SamplerChain", "SamplerParams",
           "TargetSampler", "build_chain"]

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: a random seed
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data, as numpy


@dataclass(frozen=True)
class SamplerParams:
    """Sampling knobs with llama.cpp's names and defaults (common/common.h)."""

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    min_keep: int = 0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    grammar: str | None = None
    grammar_root: str = "root"
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _check_field_types(self)
        if not np.isfinite(self.temp) or self.temp < 0:
            raise ValueError(f"temp must be a finite number >= 0, got {self.temp}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.typical_p <= 0:
            raise ValueError(f"typical_p must be > 0, got {self.typical_p}")
        if self.min_keep < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        if self.penalty_repeat <= 0:
            raise ValueError(f"penalty_repeat must be > 0, got {self.penalty_repeat}")
        if not 0 <= int(self.seed) <= 0xFFFFFFFF:
            raise ValueError(f"seed must fit in uint32, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def replace(self, **changes: Any) -> SamplerParams:
        """A copy with `changes` applied (checked again)."""
        return dataclasses.replace(self, **changes)


def ignore_eos_params(params: SamplerParams, model: Model) -> SamplerParams:
    """llama.cpp's --ignore-eos: a -inf logit bias on every EOG token (common/common.cpp), so
    an end-of-generation token is never sampled (not merely not stopped at)."""
    have = {int(t) for t, b in params.logit_bias if b == -np.inf}
    extra = tuple((t, -np.inf) for t in model.eog_tokens if t not in have)
    return params.replace(logit_bias=params.logit_bias + extra) if extra else params


_INT_FIELDS = ("top_k", "min_keep", "penalty_last_n", "dry_allowed_length", "dry_penalty_last_n", "seed")
_FLOAT_FIELDS = ("temp", "top_p", "min_p", "typical_p", "top_n_sigma", "dynatemp_range", "dynatemp_exponent",
                 "penalty_repeat", "penalty_freq", "penalty_present", "dry_multiplier", "dry_base",
                 "xtc_probability", "xtc_threshold")


def _check_field_types(sp: SamplerParams) -> None:
    """TypeError/ValueError naming the field before any value reaches C (int32 / finite float)."""
    for name in _INT_FIELDS:
        v = getattr(sp, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        hi = 0xFFFFFFFF if name == "seed" else 2**31 - 1
        if not -(2**31) <= int(v) <= hi:
            raise ValueError(f"{name} out of range, got {v}")
    for name in _FLOAT_FIELDS:
        v = getattr(sp, name)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a number, got {type(v).__name__}")
        if not np.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    if sp.grammar is not None and not isinstance(sp.grammar, str):
        raise TypeError(f"grammar must be a string or None, got {type(sp.grammar).__name__}")
    if not isinstance(sp.grammar_root, str):
        raise TypeError(f"grammar_root must be a string, got {type(sp.grammar_root).__name__}")


class CandidateBuffers:
    """Preallocated full-vocabulary buffers a sampler chain works on, and p read out of them.

    ``cand`` is a numpy view (dtype TOKEN_DATA, shape (n_vocab,)) of the llama_token_data array
    that ``cur`` points at; :meth:`probs` returns views of ``ids``/``probs``, valid until the
    next fill. Shared by the target sampler and the drafter's mirror sampler.
    """

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = int(n_vocab)
        self.buf = ffi.new("llama_token_data[]", self.n_vocab)
        self.cand = np.frombuffer(ffi.buffer(self.buf), dtype=TOKEN_DATA)
        self.cur = ffi.new("llama_token_data_array *")
        self.ids = np.zeros(self.n_vocab, dtype=np.int32)
        self.probs = np.zeros(self.n_vocab, dtype=np.float32)
        self._ids_p = ffi.cast("int32_t *", self.ids.ctypes.data)
        self._probs_p = ffi.cast("float *", self.probs.ctypes.data)

    def fill(self, row: np.ndarray, top_k: int = 0) -> Any:
        """Candidates of one contiguous float32 logits row (n_vocab,), cut to its `top_k`
        largest when top_k > 0 (only valid when nothing before top-k edits logits); returns cur."""
        ptr = ffi.cast("float *", row.ctypes.data)
        if top_k > 0:
            lib.lsp_candidates_init_top_k(ptr, self.n_vocab, top_k, self.buf, self.cur)
        else:
            lib.lsp_candidates_init(ptr, self.n_vocab, self.buf, self.cur)
        return self.cur

    def probs_view(self) -> tuple[np.ndarray, np.ndarray]:
        """Softmax over the current candidates: (ids int32, probs float32) views, (n,) each."""
        n = lib.lsp_candidates_probs(self.cur, self._ids_p, self._probs_p)
        return self.ids[:n], self.probs[:n]

    def one_hot(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        """p one-hot on `token` (the greedy p), as views of length 1."""
        self.ids[0] = token
        self.probs[0] = 1.0
        return self.ids[:1], self.probs[:1]


class ReasoningBudget(NativeHandle):
    """llama.cpp's reasoning-budget sampler (common/reasoning-budget.cpp) through the shim.

    Counts tokens after any of `start` sequences; after `budget` tokens (and a complete UTF-8
    character) it forces `forced` token by token (p one-hot), then passes everything through.
    """

    _kind = "ReasoningBudget"
    STATES = ("idle", "counting", "forcing", "waiting_utf8", "done")

    def __init__(self, model: Model, *, start: Sequence[Sequence[int]], end: Sequence[Sequence[int]],
                 forced: Sequence[int], budget: int, initial_state: str = "idle") -> None:
        if budget < 0:
            raise ValueError(f"reasoning budget must be >= 0, got {budget}")
        if initial_state not in self.STATES:
            raise ValueError(f"initial_state {initial_state!r}: expected one of {self.STATES}")
        if not forced:
            raise ValueError("the forced end sequence is empty")
        for seq in [*start, *end, forced]:
            for t in seq:
                model._check_token(t)
        self.model = model
        self.budget = int(budget)
        self._keep: list[Any] = []  # cffi arrays the sampler reads: alive as long as it

        def flat(seqs: Sequence[Sequence[int]]) -> tuple[Any, Any, int]:
            toks = [int(t) for s in seqs for t in s]
            lens = [len(s) for s in seqs]
            a = ffi.new("int32_t[]", toks or [0])
            b = ffi.new("int32_t[]", lens or [0])
            self._keep += [a, b]
            return a, b, len(seqs)

        s, sl, ns = flat(start)
        e, el, ne = flat(end)
        f = ffi.new("int32_t[]", [int(t) for t in forced])
        ptr = lib.lsp_reasoning_budget_init(model.vocab_ptr, s, sl, ns, e, el, ne, f, len(forced),
                                            self.budget, self.STATES.index(initial_state))
        if ptr == ffi.NULL:
            raise ValueError("llama.cpp rejected the reasoning-budget parameters")
        self._adopt(ptr)

    @classmethod
    def _wrap(cls, model: Model, ptr: Any, budget: int, keep: list[Any]) -> ReasoningBudget:
        obj = cls.__new__(cls)
        obj.model, obj.budget, obj._keep = model, budget, keep
        obj._adopt(ptr)
        return obj

    def _free(self, ptr: Any) -> None:
        lib.llama_sampler_free(ptr)

    @property
    def state(self) -> str:
        return self.STATES[lib.lsp_reasoning_budget_get_state(self.ptr)]

    def force(self) -> bool:
        """Jump to FORCING now (e.g. the user pressed stop-thinking)."""
        return bool(lib.lsp_reasoning_budget_force(self.ptr))

    def clone(self) -> ReasoningBudget:
        return ReasoningBudget._wrap(self.model, lib.llama_sampler_clone(self.ptr), self.budget, self._keep)


def _penalties_on(params: SamplerParams) -> bool:
    return params.penalty_last_n != 0 and (
        params.penalty_repeat != 1.0 or params.penalty_freq != 0.0 or params.penalty_present != 0.0)


def _bans(params: SamplerParams) -> list[int]:
    """The banned token ids when every logit bias is -inf (e.g. ignore_eos' EOG bans), else []."""
    if params.logit_bias and all(b == -np.inf for _, b in params.logit_bias):
        return sorted({int(t) for t, _ in params.logit_bias})
    return []


def _edits_logits(params: SamplerParams) -> bool:
    """Does the chain change logits before its first cut (logit bias, penalties, DRY)?"""
    return bool(params.logit_bias) or _penalties_on(params) or params.dry_multiplier > 0


def _edits_logits_beyond_bans(params: SamplerParams) -> bool:
    """As _edits_logits, but -inf biases only (bans) do not count: the fast paths apply those
    to a copy of the row, which is what the chain's logit-bias member does to the candidates."""
    return (bool(params.logit_bias) and not _bans(params)) or _penalties_on(params) or params.dry_multiplier > 0


def build_chain(params: SamplerParams, model: Model, *, with_dist: bool) -> tuple[Any, list[Any]]:
    """llama.cpp's sampler chain for `params` (common/sampling.cpp's default order).

    Returns (chain pointer, cffi objects that must live as long as the chain); the caller
    frees the chain (llama_sampler_free). Without `with_dist` the chain stops before dist.
    """
    cp = lib.llama_sampler_chain_default_params()
    cp.no_perf = True
    ch = lib.llama_sampler_chain_init(cp)

    def add(s: Any) -> None:
        lib.llama_sampler_chain_add(ch, s)

    n_vocab = model.n_vocab
    keep: list[Any] = []
    if params.logit_bias:
        arr = ffi.new("llama_logit_bias[]", [(int(t), float(b)) for t, b in params.logit_bias])
        keep.append(arr)
        add(lib.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), arr))
    if _penalties_on(params):
        add(lib.llama_sampler_init_penalties(n_vocab, params.penalty_last_n, params.penalty_repeat,
                                             params.penalty_freq, params.penalty_present))
    if params.dry_multiplier > 0:
        brk = [ffi.new("char[]", s.encode()) for s in params.dry_sequence_breakers]
        arr = ffi.new("const char *[]", brk)
        keep += [brk, arr]
        add(lib.llama_sampler_init_dry(model.vocab_ptr, params.dry_multiplier, params.dry_base,
                                       params.dry_allowed_length, params.dry_penalty_last_n, arr, len(brk)))
    if params.greedy:
        if with_dist:
            add(lib.llama_sampler_init_greedy())
        return ch, keep
    mk = params.min_keep
    if params.top_n_sigma > 0:
        add(lib.llama_sampler_init_top_n_sigma(params.top_n_sigma))
    if params.top_k > 0:
        add(lib.llama_sampler_init_top_k(params.top_k))
    if params.typical_p < 1.0:
        add(lib.llama_sampler_init_typical(params.typical_p, mk))
    if params.top_p < 1.0:
        add(lib.llama_sampler_init_top_p(params.top_p, mk))
    if params.min_p > 0.0:
        add(lib.llama_sampler_init_min_p(params.min_p, mk))
    if params.xtc_probability > 0:
        add(lib.llama_sampler_init_xtc(params.xtc_probability, params.xtc_threshold, mk, params.seed))
    if params.dynatemp_range > 0:
        add(lib.llama_sampler_init_temp_ext(params.temp, params.dynatemp_range, params.dynatemp_exponent))
    else:
        add(lib.llama_sampler_init_temp(params.temp))
    if with_dist:
        add(lib.llama_sampler_init_dist(params.seed))
    return ch, keep


class SamplerChain(NativeHandle):
    """An owned llama.cpp sampler chain for `params` (:func:`build_chain`): ``ptr`` is the chain,
    freed once (``close()``, the context manager or the finalizer), with the cffi arrays it reads."""

    _kind = "SamplerChain"

    def __init__(self, params: SamplerParams, model: Model, *, with_dist: bool) -> None:
        ch, self._keep = build_chain(params, model, with_dist=with_dist)
        self._adopt(ch)

    def _free(self, ptr: Any) -> None:
        lib.llama_sampler_free(ptr)


class TargetSampler(NativeHandle):
    """The target's sampler: chain (+ budget, grammar) -> p, dist for the plain path, accept().

    Owns its chain and grammar (and the budget of a clone); ``close()`` frees them once, and
    every call after it raises ValueError.
    """

    _kind = "TargetSampler"
    _grammar_state: GrammarState | None = None
    _own_budget = False

    def __init__(self, model: Model, params: SamplerParams | None = None, *,
                 reasoning_budget: ReasoningBudget | None = None, _clone_from: TargetSampler | None = None) -> None:
        self.model = model
        self.params = params or SamplerParams()
        self.n_vocab = model.n_vocab
        if _clone_from is None:
            # One chain with dist at the end; `candidates` runs all members but the last.
            ch, self._keep = build_chain(self.params, model, with_dist=True)
            self._adopt(ch)
            self.budget = reasoning_budget
            if self.params.grammar:
                g = lib.llama_sampler_init_grammar(model.vocab_ptr, self.params.grammar.encode(),
                                                   self.params.grammar_root.encode())
                if g == ffi.NULL:
                    self.close()
                    raise ValueError("llama.cpp could not parse the GBNF grammar (see the log)")
                self._grammar_state = GrammarState(g)
        else:
            self._keep = _clone_from._keep
            self._adopt(lib.llama_sampler_clone(_clone_from.ptr))
            self._own_budget = _clone_from.budget is not None
            self.budget = _clone_from.budget.clone() if _clone_from.budget is not None else None
            if _clone_from._grammar_state is not None:
                self._grammar_state = _clone_from._grammar_state.clone()
        # raw pointers for the hot path: valid while this sampler is open (checked per call)
        self._chain = self._ptr
        self._grammar = self._grammar_state.ptr if self._grammar_state is not None else ffi.NULL
        self._n_chain = lib.llama_sampler_chain_n(self._chain)
        self._members = [lib.llama_sampler_chain_get(self._chain, i) for i in range(self._n_chain)]
        plain_chain = self.budget is None and self._grammar == ffi.NULL and not _edits_logits_beyond_bans(self.params)
        # Bans (every bias -inf) are applied to a copy of the row, so the fast paths stay exact:
        # llama.cpp's logit-bias member would set the same logits to -inf before top-k/greedy.
        bans = _bans(self.params) if plain_chain else []
        self._bans = np.asarray(bans, dtype=np.int64) if bans else None
        self._masked = np.empty(self.n_vocab, dtype=np.float32) if bans else None
        n_bias = 1 if self.params.logit_bias else 0  # the logit-bias member, first in the chain
        # Fast paths that give the same p without a full-vocabulary candidate array (see
        # _shim.h): a bare greedy chain is an argmax; a chain whose first cut is top-k can start
        # from the k largest logits.
        self._argmax_only = plain_chain and self.params.greedy and self._n_chain == 1 + n_bias
        self._prefilter_k = (self.params.top_k if plain_chain and not self.params.greedy
                             and self.params.top_n_sigma <= 0 and 0 < self.params.top_k < self.n_vocab else 0)
        self._cb = CandidateBuffers(self.n_vocab)  # preallocated: nothing allocated per position
        self.n_accept_calls = 0

    def _free(self, ptr: Any) -> None:
        self._chain = self._grammar = ffi.NULL
        self._members = []
        lib.llama_sampler_free(ptr)
        if self._grammar_state is not None:
            self._grammar_state.close()
        if self._own_budget and self.budget is not None:
            self.budget.close()

    @property
    def has_grammar(self) -> bool:
        return self._grammar_state is not None

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def stateful(self) -> bool:
        """Does accept() change later p (penalties, DRY, grammar, reasoning budget)?"""
        return (self.budget is not None or self.has_grammar or _penalties_on(self.params)
                or self.params.dry_multiplier > 0)

    def clone(self) -> TargetSampler:
        return TargetSampler(self.model, self.params, _clone_from=self)

    def grammar_clone(self) -> GrammarState | None:
        """A copy of the grammar's current state (None without a grammar), for a drafter to mask
        q with and advance by its own drafts; this sampler's state is not touched."""
        if self._ptr is None:
            self._check_usable()
        return None if self._grammar_state is None else self._grammar_state.clone()

    # -- the steps ----------------------------------------------------------------------------
    def _check_row(self, logits_row: np.ndarray) -> np.ndarray:
        if self._ptr is None:
            self._check_usable()  # closed: ValueError before any pointer reaches C
        if logits_row.dtype != np.float32 or logits_row.shape[-1] != self.n_vocab:
            raise ValueError(f"logits row must be float32 of width {self.n_vocab}")
        if self._bans is not None and self._masked is not None:  # a copy: the caller's row stays as it was
            masked = self._masked
            np.copyto(masked, logits_row)
            masked[self._bans] = -np.inf
            return masked
        return np.ascontiguousarray(logits_row)

    def _prepare(self, logits_row: np.ndarray) -> Any:
        """Candidates of the row after the budget and the grammar (before the chain)."""
        row = self._check_row(logits_row)
        if self._prefilter_k:
            return self._cb.fill(row, self._prefilter_k)
        cur = self._cb.fill(row)
        if self.budget is not None:
            lib.llama_sampler_apply(self.budget.ptr, cur)
        if self._grammar != ffi.NULL:
            lib.llama_sampler_apply(self._grammar, cur)
        return cur

    def _truncate(self, logits_row: np.ndarray) -> Any:
        """Budget, grammar, then every chain member but the final dist/greedy."""
        cur = self._prepare(logits_row)
        for i in range(self._n_chain - 1):
            lib.llama_sampler_apply(self._members[i], cur)
        return cur

    def _p(self, cur: Any) -> tuple[np.ndarray, np.ndarray]:
        if self.greedy:
            # p is one-hot on the argmax logit (first index on ties, as llama.cpp's greedy sampler;
            # the greedy chain's members edit logits in place and never reorder).
            cand = self._cb.cand
            j = int(np.argmax(cand["logit"][: cur.size]))
            return self._cb.one_hot(int(cand["id"][j]))
        return self._cb.probs_view()

    def _argmax(self, logits_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._cb.one_hot(int(np.argmax(self._check_row(logits_row))))  # first index on ties, like greedy

    def candidates(self, logits_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """p after the chain, without dist: (ids, probs) views, valid until the next call."""
        if self._argmax_only:
            return self._argmax(logits_row)
        return self._p(self._truncate(logits_row))

    def candidates_and_sample(self, logits_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """p (as `candidates`) and the token the plain path's dist draws from it, in one pass.

        dist is advanced exactly as ``sample`` would advance it, so the extra-acceptance counter
        can compare the draft with the target's own sample at no extra cost.
        """
        if self._argmax_only:
            ids, probs = self._argmax(logits_row)
            return ids, probs, int(ids[0])
        cur = self._truncate(logits_row)
        ids, probs = self._p(cur)
        if self.greedy:
            return ids, probs, int(ids[0])
        lib.llama_sampler_apply(self._members[self._n_chain - 1], cur)
        sel = cur.selected
        if sel < 0 or sel >= cur.size:
            raise RuntimeError("dist selected no token")
        return ids, probs, int(cur.data[sel].id)

    def sample(self, logits_row: np.ndarray) -> int:
        """Draw a token the plain way: the same steps, then llama.cpp's dist (or greedy)."""
        if self._argmax_only:
            return int(np.argmax(self._check_row(logits_row)))
        cur = self._prepare(logits_row)
        lib.llama_sampler_apply(self._chain, cur)
        sel = cur.selected
        if sel < 0 or sel >= cur.size:
            raise RuntimeError("the sampler chain selected no token")
        return int(cur.data[sel].id)

    def accept(self, token: int) -> None:
        """Record the emitted token: exactly once per emitted position, in order."""
        if self._ptr is None:
            self._check_usable()
        if self.budget is not None:
            lib.llama_sampler_accept(self.budget.ptr, token)
        if self._grammar != ffi.NULL:
            lib.llama_sampler_accept(self._grammar, token)
        lib.llama_sampler_accept(self._chain, token)
        self.n_accept_calls += 1

    def reset(self) -> None:
        lib.llama_sampler_reset(self.ptr)
        if self._grammar != ffi.NULL:
            lib.llama_sampler_reset(self._grammar)
        if self.budget is not None:
            lib.llama_sampler_reset(self.budget.ptr)
