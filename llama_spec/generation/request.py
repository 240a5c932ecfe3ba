"""One request, validated: its objects (sampler, accept RNG, rule, observers), its emitter and its result.

Shared by every entry point (``SpeculativeGenerator``, ``BatchGenerator``, the server): a request is
checked here once (TypeError/ValueError naming the argument) and the step core
(:mod:`llama_spec.generation.core`) runs it in a slot.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..drafters.base import Drafter
from ..env import env_flag
from ..kernels import token as _accept
from ..llama.context import int32_values
from ..llama.model import Model
from ..llama.sampling import ReasoningBudget, SamplerParams, TargetSampler, ignore_eos_params
from ..observe.observers import Observer, RequestInfo
from ..observe.stats import N_MAX_LIMIT, SpecStats
from ..rules import RULE_NAMES, Rule, Verification, VerifyName

__all__ = ["ENV_DRAFT_SAMPLE", "Emitter", "GenerationRequest", "GenerationResult", "GenerationStream",
           "Request", "RequestHost", "TokenEvent", "build_request", "check_n_max", "pick_rule"]

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

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV cells were reused, not decoded (the prompt cache)."""
        return self.stats.n_cached


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
class Request:
    """One validated request: what the loop needs, built by ``build_request``."""

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
    cache_prompt: bool = True             # reuse the cells of a common prompt prefix (prefix.py)


class Emitter:
    """Emits tokens: sampler.accept, detokenize, stop conditions; collects the TokenEvents."""

    def __init__(self, model: Model, req: Request) -> None:
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


@dataclass
class GenerationRequest:
    """One sequence for a batch generator (the fields of SpeculativeGenerator.stream).

    tree: a tree shape for this request (e.g. (3, 1, 1) or "3,1,1"; None: the generator's default);
    the generator must have been built with room for it (``tree=`` of its constructor).
    """

    prompt: str | list[int]
    sampling: SamplerParams = SamplerParams()
    n_predict: int = 128
    seed: int | None = None
    stop: Sequence[str] = ()
    verify: str | Rule | None = None   # None: the default rule ("token")
    n_max: int | None = None
    ignore_eos: bool = False
    tree: str | Sequence[int] | None = None
    p_min: float = 0.0
    reasoning_budget: ReasoningBudget | None = None
    spec_draft_sample: bool | None = None
    observers: Sequence[Observer] = field(default_factory=tuple)
    cache_prompt: bool = True


@dataclass(frozen=True)
class RequestHost:
    """What validating a request needs of its generator (the step core, for one slot)."""

    model: Model
    drafter: Drafter | None
    rules: dict[str, Rule]
    scratch: np.ndarray            # float32 (>= n_vocab,), shared by the requests run one after another
    observers: tuple[Observer, ...]
    n_max: int                     # the default n_max
    n_ctx: int                     # the sequence's context
    n_rs_seq: int | None           # recurrent/hybrid target: state snapshots per sequence; else None


def build_request(host: RequestHost, prompt: str | Sequence[int], sampling: SamplerParams | None, n_predict: int,
                  seed: int | None, spec_draft_sample: bool | None, verify: VerifyName | Rule,
                  n_max: int | None, p_min: float, stop: Sequence[str], reasoning_budget: ReasoningBudget | None,
                  ignore_eos: bool, observers: Iterable[Observer], cache_prompt: bool = True) -> Request:
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
    check_n_max(n_max)
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
    if not isinstance(cache_prompt, (bool, np.bool_)):
        raise TypeError(f"cache_prompt must be a bool, got {type(cache_prompt).__name__}")
    return Request(tokens, sampler, rule, switch, int(n_predict), n_max, float(p_min), [s for s in stop if s],
                   bool(ignore_eos), obs, stats, v, info, cache_prompt=bool(cache_prompt))


def pick_rule(rules: dict[str, Rule], verify: VerifyName | Rule, switch: bool) -> Rule:
    """The requested rule (a name or a Rule object); exact-match when the switch is off."""
    if isinstance(verify, Rule):
        rule = verify
    elif verify in RULE_NAMES:
        rule = rules[verify]
    else:
        raise ValueError(f"verify must be one of {', '.join(RULE_NAMES)} (or a Rule), got {verify!r}")
    return rule if switch else rules["exact-match"]


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


def check_n_max(n_max: int) -> None:
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)):
        raise TypeError(f"n_max must be an int, got {type(n_max).__name__}")
    if not 1 <= int(n_max) <= N_MAX_LIMIT:
        raise ValueError(f"n_max must be in [1, {N_MAX_LIMIT}], got {n_max}")
