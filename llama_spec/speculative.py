"""The speculative loop: draft -> one verification batch -> rule -> emit -> roll back.

Per verification (docs/design.md words; the rules are in llama_spec.rules):

1. the drafter proposes k <= n_max tokens, with q per token when it sampled them (a *proposal*);
2. the target decodes [last emitted token, d_1 .. d_k] in one batch (k + 1 logits rows);
3. ``rules.choose`` picks the rule (the requested one, or exact-match where a fallback applies)
   and the rule decides the emitted tokens; each goes through ``_Emitter.emit``, which calls the
   target sampler's ``accept`` exactly once per emitted position, in order (invariant 5);
4. the rejected tail leaves the target's and the drafter's memory (KV cells, recurrent state);
5. the observers (SpecStats, TopKStats, p/q logs, user callbacks) see what happened.

The loop knows no concrete drafter or rule. ``drafter=None`` is plain generation with the same
sampler: the reference the speculative modes are tested against.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import accept as _accept
from .context import Context, int32_values
from .draft_length import DraftLengthController
from .drafters.base import Drafter, Proposal
from .env import env_flag
from .errors import GeneratorBusyError
from .model import Model
from .observers import Observer, RequestInfo
from .rules import RULE_NAMES, Rule, Verification, VerifyName, choose, make_rules
from .rules.tree import TreeRule
from .sampling import ReasoningBudget, SamplerParams, TargetSampler, ignore_eos_params
from .stats import N_MAX_LIMIT, SpecStats
from .tree_verify import TreeProposal, check_tree, commit_tree, decode_tree, propose_tree, tree_n_seqs
from .types import OutputsSpec

__all__ = ["ENV_DRAFT_SAMPLE", "N_MAX_LIMIT", "GenerationResult", "GenerationStream", "SpecStats",
           "SpeculativeGenerator", "TokenEvent", "VerifyName", "generate"]

ENV_DRAFT_SAMPLE = "LLAMA_ARG_SPEC_DRAFT_SAMPLE"
_ACCEPT_SEED_SALT = 0x5EC0_DEC0  # the accept RNG is seeded apart from llama.cpp's dist RNG


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stop_reason: str           # "eos" | "stop" | "length" | "context_full"
    stats: SpecStats
    prompt_tokens: list[int]
    spec_draft_sample: bool
    verify: str = "token"      # the rule asked for, after the switch ("exact-match" when it is off)


@dataclass
class TokenEvent:
    token: int
    text: str                  # the new complete UTF-8 text this token finished (may be "")
    accepted_draft: bool


class GenerationStream:
    """Iterable of TokenEvent; ``result`` holds the GenerationResult once iteration has finished."""

    def __init__(self) -> None:
        self.result: GenerationResult | None = None
        self._it: Iterator[TokenEvent] = iter(())
        self._release: Any = None   # gives the generator back (a stream that is never iterated too)

    def __del__(self) -> None:
        if self._release is not None:
            self._release()

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> TokenEvent:
        return next(self._it)

    def close(self) -> None:
        """Stop early (the generator's context stays usable for the next request)."""
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


@dataclass(eq=False)
class _Request:
    """One validated request: what the loop needs, built by ``SpeculativeGenerator._request``."""

    prompt: list[int]
    sampler: TargetSampler
    rule: Rule
    switch: bool               # spec_draft_sample: False forces exact-match
    n_predict: int
    n_max: int
    p_min: float
    stops: list[str]
    ignore_eos: bool
    observers: tuple[Observer, ...]   # SpecStats first
    stats: SpecStats
    v: Verification
    info: RequestInfo
    tree: tuple[int, ...] | None = None   # a tree shape: tree proposals, the tree rule


class _Emitter:
    """Emits tokens: sampler.accept, detokenize, stop conditions; collects the TokenEvents."""

    def __init__(self, model: Model, req: _Request) -> None:
        self.model, self.sampler, self.v = model, req.sampler, req.v
        self.n_predict, self.ignore_eos, self.stops = req.n_predict, req.ignore_eos, req.stops
        self.stop_len = max(map(len, req.stops)) if req.stops else 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []
        self.tokens: list[int] = []
        self.history = list(req.prompt)
        self.events: list[TokenEvent] = []
        self.stop_reason: str | None = None
        self.tail = ""

    def emit(self, tok: int, was_draft: bool) -> bool:
        """Emit one decided token (the rules call this); False once the request has stopped."""
        self.sampler.accept(tok)
        self.v.emitted.append(tok)
        self.tokens.append(tok)
        self.history.append(tok)
        piece = self.decoder.decode(self.model.token_to_piece(tok))
        if piece:
            self.parts.append(piece)
            if self.stops:
                self.tail = (self.tail + piece)[-(self.stop_len + len(piece)):]
                if any(s in self.tail for s in self.stops):
                    self.stop_reason = "stop"
        if self.stop_reason is None:
            if not self.ignore_eos and self.model.is_eog(tok):
                self.stop_reason = "eos"
            elif len(self.tokens) >= self.n_predict:
                self.stop_reason = "length"
        self.events.append(TokenEvent(tok, piece, was_draft))
        return self.stop_reason is None

    def take_events(self) -> list[TokenEvent]:
        ev, self.events = self.events, []
        return ev

    def text(self) -> str:
        self.parts.append(self.decoder.decode(b"", final=True))
        text = "".join(self.parts)
        if self.stop_reason == "stop":
            cut = min((text.find(s) for s in self.stops if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text


class SpeculativeGenerator:
    """Owns the target context and a drafter; runs requests one after another.

    ``observers`` watch every request (``add_observer`` adds more); ``stream``/``generate`` take
    per-request observers too.
    """

    def __init__(self, target: Model, drafter: Drafter | None = None, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_threads: int | None = None, n_max: int = 3,
                 observers: Iterable[Observer] = (), context_options: Mapping[str, Any] | None = None,
                 tree: str | Sequence[int] | None = None, adaptive_draft: bool = False) -> None:
        # context_options: more Context keywords for the target (n_ubatch, flash_attn, type_k, type_v)
        # adaptive_draft: cut each proposal to the length with the most expected tokens per second
        # (draft_length.py; speed only: a prefix of a draft is a draft)
        self.model = target
        self.drafter = drafter
        if drafter is not None and drafter.vocab_size and drafter.vocab_size != target.n_vocab:
            raise ValueError(
                f"draft vocabulary ({drafter.vocab_size} tokens) differs from the target's ({target.n_vocab})"
            )
        _check_n_max(n_max)
        self.n_max = int(n_max)
        # Rolling back rejected drafts on recurrent/hybrid models restores state snapshots: one
        # per draft position (each can be large on big hybrid models), so size them by n_max.
        self.recurrent = bool(target.is_recurrent or target.is_hybrid)
        n_rs = self.n_max if self.recurrent else 0
        # tree: the default shape of every request; checked (ValueError) before any context exists
        self.tree = None if tree is None else check_tree(tree, target, drafter)
        seqs: dict[str, Any] = {"n_seq_max": tree_n_seqs(self.tree), "kv_unified": True} if self.tree else {}
        self.ctx = Context(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_rs_seq=n_rs, **seqs,
                           **dict(context_options or {}))
        if drafter is not None:
            drafter.prepare_target(self.ctx)
        self.scratch = _accept.new_scratch(target.n_vocab)
        self.rules: dict[str, Rule] = make_rules()
        self._tree_rule = TreeRule()   # built-in rules by name (they keep scratch)
        self.observers: list[Observer] = list(observers)
        self._cached_prompt: np.ndarray | None = None
        self._cached_full: tuple[np.ndarray, np.ndarray] | None = None  # (prompt, its last logits (1, n_vocab))
        self.total = SpecStats()
        self.draft_length = DraftLengthController() if adaptive_draft else None
        self._prop_key: object = None   # which drafter (a chain's member) made the proposal being verified
        self._last_full = False         # the last verification kept all its drafts
        self._owner_lock = threading.Lock()
        self._owner: tuple[int, object] | None = None   # (thread id, token) of the request that owns the loop

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.ctx.close()

    def add_observer(self, observer: Observer) -> Observer:
        """Watch every later request; returns the observer."""
        self.observers.append(observer)
        return observer

    def remove_observer(self, observer: Observer) -> None:
        self.observers.remove(observer)

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
        result: list | None = None,
        tree: str | Sequence[int] | None = None,
    ) -> GenerationStream:
        """Validate the request now; return a stream of TokenEvent (``.result`` after iteration).

        verify: the rule ("token" default, "block", "exact-match", or a Rule object);
        spec_draft_sample=False (or LLAMA_ARG_SPEC_DRAFT_SAMPLE=0) forces exact-match.
        ``result`` (a list the GenerationResult is appended to) is kept for older callers.
        """
        token = self._acquire()  # before the request touches the drafter: another thread's may be running
        try:
            req = self._request(prompt, sampling, n_predict, seed, spec_draft_sample, verify, n_max, p_min, stop,
                                reasoning_budget, ignore_eos, observers)
            out = GenerationStream()
            req.tree = self._request_tree(tree)
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

    def _exclusive(self, it: Iterator[TokenEvent], token: object) -> Iterator[TokenEvent]:
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
            close = getattr(it, "close", None)
            if close is not None:
                close()
            self._release(token)

    def generate(self, prompt: str | Sequence[int], **kwargs) -> GenerationResult:
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def _request(self, prompt, sampling, n_predict, seed, spec_draft_sample, verify, n_max, p_min, stop,
                 reasoning_budget, ignore_eos, observers) -> _Request:
        """Check every argument (ValueError naming it) and build the request's objects."""
        return build_request(
            RequestHost(self.model, self.drafter, self.rules, self.scratch, tuple(self.observers), self.n_max,
                        self.ctx.n_ctx, self.ctx.n_rs_seq if self.recurrent else None),
            prompt, sampling, n_predict, seed, spec_draft_sample, verify, n_max, p_min, stop,
            reasoning_budget, ignore_eos, observers)

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self, req: _Request, out: GenerationStream, result: list | None) -> Iterator[TokenEvent]:
        em = _Emitter(self.model, req)
        v, drafter, exact = req.v, self.drafter, self.rules["exact-match"]
        v.emit = em.emit
        for ob in req.observers:
            ob.on_request(req.info)
        t0 = time.perf_counter()
        # llama-speculative-simple's shapes (a drafter that asks for them, no tree, repacked weights as
        # llama.cpp's default): prefill prompt[:-1], then the first verification is [prompt[-1], drafts..]
        # (invariant 12). Without repacking plain generation's prefill is kept: greedy == plain, bitwise (2).
        # Greedy only for now: a seeded temp>0 run diverged at its first token in this mode (issue 15 report).
        native = (drafter is not None and drafter.native_prompt_split and self.model.repack and not req.tree
                  and len(req.prompt) > 1 and req.sampler.params.greedy)
        logits = self._prefill(req.prompt, head_only=native)
        t1 = time.perf_counter()
        req.stats.t_prompt_s = t1 - t0
        # The first token after the prompt is the target's own sample: a verification without drafts.
        pos0, first = len(req.prompt) - 1, True
        prop: Proposal | TreeProposal = Proposal()
        batch = np.asarray(req.prompt[-1:], dtype=np.int32)
        if native:
            k = min(req.n_max, self.ctx.n_ctx - 1 - pos0, req.n_predict - 1)
            prop = self._propose(em.history, k, req.p_min)
            batch = np.asarray([req.prompt[-1], *prop.tokens], dtype=np.int32)
            logits, first = self._decode_observed(batch, pos0, "all"), False
        while True:
            rule = self._tree_rule if isinstance(prop, TreeProposal) else choose(req.rule, exact, prop, req.sampler,
                                                                                   req.switch)
            assert logits is not None  # the prefill's row, or this verification's rows
            # a TreeProposal only ever reaches the tree rule (chosen just above)
            v.begin(pos0, batch, logits, prop, rule.name, len(em.tokens), first)  # type: ignore[arg-type]
            n_acc = rule.verify(v)
            if not first:
                # Rejected drafts leave no trace: keep [.., last emitted before, kept drafts].
                if isinstance(prop, TreeProposal):
                    commit_tree(self.ctx, prop, pos0)  # seq 0 = the accepted path, no other sequence
                else:
                    self.ctx.rollback(0, pos0 + n_acc + 1)
                if self.draft_length is not None and not isinstance(prop, TreeProposal):
                    self.draft_length.record_verify(self._prop_key, len(prop), n_acc)
                    self._last_full = len(prop) > 0 and n_acc == len(prop)
                if drafter is not None:
                    drafter.accepted(n_acc)
            for ob in req.observers:
                ob.on_verify(v)
            yield from em.take_events()
            if em.stop_reason is not None:
                break
            first = False
            pos0 = len(em.history) - 1  # position of the last emitted token (not yet decoded)
            room = self.ctx.n_ctx - 1 - pos0
            if room < 0:
                em.stop_reason = "context_full"
                break
            left = req.n_predict - len(em.tokens) - 1
            if req.tree:  # a tree proposal, verified in one multi-sequence batch (tree_verify.py)
                tprop = propose_tree(self.drafter, em.history, req.tree, min(room, left), room,  # type: ignore[arg-type]
                                     req.p_min)
                batch, logits = decode_tree(self.ctx, tprop, em.history[-1], pos0)
                prop = tprop
            else:
                prop = self._propose(em.history, min(req.n_max, room, left), req.p_min)
                batch = np.asarray([em.history[-1], *prop.tokens], dtype=np.int32)
                logits = self._decode_observed(batch, pos0, "all")
        req.stats.t_decode_s = time.perf_counter() - t1
        res = self._finish(req, em)
        out.result = res
        if result is not None:
            result.append(res)

    def _finish(self, req: _Request, em: _Emitter) -> GenerationResult:
        self.total += req.stats
        res = GenerationResult(text=em.text(), tokens=em.tokens, stop_reason=em.stop_reason or "length",
                               stats=req.stats, prompt_tokens=req.prompt, spec_draft_sample=req.switch,
                               verify=req.rule.name)
        for ob in req.observers:
            ob.on_result(res)
        return res

    def _request_tree(self, tree: str | Sequence[int] | None) -> tuple[int, ...] | None:
        """A request's tree shape (None: the generator's); ValueError when its context cannot hold it."""
        if tree is None:
            return self.tree
        shape = check_tree(tree, self.model, self.drafter)
        if self.ctx.n_seq_max < tree_n_seqs(shape) or (self.tree is None and tree_n_seqs(shape) > 1):
            raise ValueError(f"tree: {shape} needs {tree_n_seqs(shape)} sequences in the target context, this "
                             f"generator has {self.ctx.n_seq_max}: build it with SpeculativeGenerator(..., tree=...)")
        return shape

    def _propose(self, history: list[int], k_cap: int, p_min: float) -> Proposal:
        """The drafter's proposal for the next verification, cut to k_cap tokens."""
        if self.drafter is None or k_cap <= 0:
            return Proposal()
        prop = self.drafter.draft(history, k_cap, p_min)
        if self.draft_length is not None:
            # per drafter (a chain's member) and per "the last verification kept every draft": copying
            # runs of n-gram drafts are kept whole, other drafts fail early (two survival curves)
            self._prop_key = (self.drafter.proposer(), self._last_full)
            k_cap = min(k_cap, self.draft_length.cut(self._prop_key, len(prop)))
        if len(prop) > k_cap:
            for seq in (prop.tokens, prop.q_ids, prop.q_probs, prop.topk_ids, prop.topk_probs):
                if seq is not None:
                    del seq[k_cap:]
        return prop

    def _decode_observed(self, tokens: np.ndarray, pos0: int, outputs: OutputsSpec) -> np.ndarray:
        timer = self.draft_length if outputs == "all" else None   # a verification batch: its cost
        t0 = time.perf_counter() if timer is not None else 0.0
        logits = self.ctx.decode(tokens, np.arange(pos0, pos0 + len(tokens), dtype=np.int32), 0, outputs)
        if timer is not None:
            timer.record_decode(len(tokens), time.perf_counter() - t0)
        if self.drafter is not None:
            self.drafter.observe(tokens, pos0, self.ctx)
        return logits

    def _prefill(self, prompt: list[int], head_only: bool = False) -> np.ndarray | None:
        """Decode the prompt as llama-completion does: all of it, last token included, in chunks of
        n_batch with the last token's logits; returns those logits, (1, n_vocab). head_only: as
        llama-speculative-simple, prompt[:-1] only (returns None; the caller decodes the last token).

        Prompt cache: a prompt equal to the last freshly prefilled one keeps its KV cells and reuses
        the saved logits of that prefill, so nothing is decoded and the result is bit-identical
        (without a drafter, or with one whose observe() reads no target outputs). Otherwise a
        prompt longer than n_batch that equals the last one up to its last token re-decodes only
        that token, on its own; its logits may then differ from a fresh prefill's in the last bits
        (batched and single-token kernels round differently, flash attention too, even without
        repacking). Any other prompt is prefilled afresh.
        """
        toks = np.asarray(prompt, dtype=np.int32)
        n_head = len(toks) - 1
        drafter = self.drafter
        full = self._cached_full
        if (not head_only and full is not None and np.array_equal(full[0], toks)
                and (drafter is None or drafter.observe_without_target_outputs)
                and self.ctx.seq_rm(0, len(toks), -1) and self.ctx.pos_max(0) == n_head):
            if drafter is not None:  # what the drafter sees on the other cache path, minus the decode
                drafter.restore_prompt(n_head)
                drafter.observe(toks[-1:], n_head, self.ctx)
            return full[1].copy()
        self._cached_full = None
        # Recurrent state can only be rolled back n_rs_seq positions: beyond that, prefill again.
        if (len(toks) > self.ctx.n_batch and self._cached_prompt is not None
                and np.array_equal(self._cached_prompt, toks[:-1]) and self.ctx.seq_rm(0, n_head, -1)):
            if drafter is not None:
                drafter.restore_prompt(n_head)
            return None if head_only else self._decode_observed(toks[-1:], n_head, "last")
        self._cached_prompt = None
        self.ctx.clear()
        if drafter is not None:
            drafter.begin(prompt)
        n_batch, todo = self.ctx.n_batch, toks[:-1] if head_only else toks
        logits = None
        for off in range(0, len(todo), n_batch):
            logits = self._decode_observed(todo[off : off + n_batch], off, "last")
        if drafter is not None:
            drafter.snapshot_prompt(n_head)
        self._cached_prompt = toks[:-1].copy()
        if logits is not None and not head_only:
            self._cached_full = (toks.copy(), np.array(logits, dtype=np.float32, copy=True))
        return logits


@dataclass(frozen=True)
class RequestHost:
    """What validating a request needs of its generator (SpeculativeGenerator, or one batch slot)."""

    model: Model
    drafter: Drafter | None
    rules: dict[str, Rule]
    scratch: np.ndarray            # float32 (>= n_vocab,), shared by the requests run one after another
    observers: tuple[Observer, ...]
    n_max: int                     # the default n_max
    n_ctx: int                     # the sequence's context
    n_rs_seq: int | None           # recurrent/hybrid target: state snapshots per sequence; else None


def build_request(host: RequestHost, prompt, sampling, n_predict, seed, spec_draft_sample, verify, n_max, p_min,
                  stop, reasoning_budget, ignore_eos, observers) -> _Request:
    """Check every argument of one request (ValueError naming it) and build its objects."""
    _check_request_types(sampling=sampling, seed=seed, n_max=n_max, n_predict=n_predict, p_min=p_min, stop=stop)
    sampling = sampling or SamplerParams()
    if seed is not None:
        sampling = sampling.replace(seed=int(seed) & 0xFFFFFFFF)
    if ignore_eos:
        sampling = ignore_eos_params(sampling, host.model)
    switch = env_flag(ENV_DRAFT_SAMPLE, True) if spec_draft_sample is None else bool(spec_draft_sample)
    rule = pick_rule(host.rules, verify, switch)
    n_max = host.n_max if n_max is None else int(n_max)
    _check_n_max(n_max)
    if host.n_rs_seq is not None and n_max > host.n_rs_seq:
        raise ValueError(
            f"n_max={n_max} exceeds the n_max={host.n_rs_seq} this generator was built with: a "
            "recurrent/hybrid target keeps one state snapshot per draft position (build it with a larger n_max)"
        )
    if not 0.0 <= p_min <= 1.0:
        raise ValueError(f"p_min must be in [0, 1], got {p_min}")
    if n_predict <= 0:
        raise ValueError(f"n_predict must be > 0, got {n_predict}")
    model = host.model
    if not isinstance(prompt, (str, Sequence, np.ndarray)):
        raise TypeError(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
    tokens = model.tokenize(prompt) if isinstance(prompt, str) else int32_values(prompt, "prompt").tolist()
    if any(not 0 <= t < model.n_vocab for t in tokens):
        raise ValueError(f"prompt: a token id is outside [0, {model.n_vocab})")
    if not tokens:
        raise ValueError("empty prompt")
    if len(tokens) >= host.n_ctx:
        raise ValueError(f"prompt of {len(tokens)} tokens does not fit the context of n_ctx={host.n_ctx} tokens")
    sampler = TargetSampler(model, sampling, reasoning_budget=reasoning_budget.clone() if reasoning_budget else None)
    stats = SpecStats(n_prompt=len(tokens))
    obs = (stats, *host.observers, *observers)
    rng = _accept.new_rng_state((sampling.seed ^ _ACCEPT_SEED_SALT) & 0xFFFFFFFF)
    v = Verification(sampler, rng, host.scratch, record_pq=any(o.wants_pq for o in obs))
    if host.drafter is not None:
        host.drafter.configure(sampling, sampling.seed, sample=switch, collect_topk=any(o.wants_topk for o in obs))
        host.drafter.bind_grammar(sampler.grammar_clone if sampler.has_grammar else None)  # q masked like p
    info = RequestInfo(tokens, sampler, rng, rule.name, n_max)
    return _Request(tokens, sampler, rule, switch, int(n_predict), n_max, float(p_min), [s for s in stop if s],
                    bool(ignore_eos), obs, stats, v, info)


def pick_rule(rules: dict[str, Rule], verify: VerifyName | Rule, switch: bool) -> Rule:
    """The requested rule (a name or a Rule object); exact-match when the switch is off."""
    if isinstance(verify, Rule):
        rule = verify
    elif verify in RULE_NAMES:
        rule = rules[verify]
    else:
        raise ValueError(f"verify must be one of {', '.join(RULE_NAMES)} (or a Rule), got {verify!r}")
    return rule if switch else rules["exact-match"]


# Public names for the batched generator (llama_spec.batch), which runs the same requests per slot.
Request = _Request
Emitter = _Emitter


def _check_request_types(*, sampling: Any, seed: Any, n_max: Any, n_predict: Any, p_min: Any, stop: Any) -> None:
    """TypeError naming the argument for values of the wrong kind (before int()/float() could
    overflow or silently truncate)."""
    if sampling is not None and not isinstance(sampling, SamplerParams):
        raise TypeError(f"sampling must be a SamplerParams, got {type(sampling).__name__}")
    for name, v, none_ok in (("seed", seed, True), ("n_max", n_max, True), ("n_predict", n_predict, False)):
        if (v is None and none_ok) or (isinstance(v, (int, np.integer)) and not isinstance(v, bool)):
            continue
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float, np.floating, np.integer)):
        raise TypeError(f"p_min must be a number, got {type(p_min).__name__}")
    if isinstance(stop, str) or not isinstance(stop, (Sequence, tuple)) or not all(isinstance(x, str) for x in stop):
        raise TypeError("stop must be a sequence of strings")


def _check_n_max(n_max: int) -> None:
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)):
        raise TypeError(f"n_max must be an int, got {type(n_max).__name__}")
    if not 1 <= int(n_max) <= N_MAX_LIMIT:
        raise ValueError(f"n_max must be in [1, {N_MAX_LIMIT}], got {n_max}")


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
