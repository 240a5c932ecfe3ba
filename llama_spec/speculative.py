"""The speculative loop: draft -> verify in one target batch -> accept position by position.

Per verification (DESIGN.md words):

1. the drafter proposes k <= n_max tokens with q per token (a *proposal*);
2. the target decodes [last emitted token, d_1 .. d_k] in one batch (k + 1 logits rows);
3. position by position, in Python: the target sampler chain gives p; the **rejection rule**
   (``accept_step_kernel``) keeps d_i with probability min(1, p/q) or emits a *recovered*
   token from the residual; the **exact-match rule** keeps d_i only if the target's own
   sample equals it. The emitted token goes to ``sampler.accept`` exactly once, before p of the
   next position is computed (reasoning budget, grammar and penalties stay exact);
4. if all k were kept, a *bonus* token is drawn from p at position k;
5. the rejected tail leaves the target's and the drafter's memory (KV cells, recurrent state).

The exact-match rule is used, byte for byte as the old loop, when there is no proposal, its q
does not match the draft length, a grammar is active, the switch is off, or (per position)
p does not sum to 1 +- 1e-3. Temperature 0 is the exact-match rule in either mode and uses no
randomness.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import accept as _accept
from .context import Context
from .drafters.base import Drafter, Proposal
from .env import env_flag
from .model import Model
from .sampling import ReasoningBudget, SamplerParams, TargetSampler

N_MAX_LIMIT = 64
ENV_DRAFT_SAMPLE = "LLAMA_ARG_SPEC_DRAFT_SAMPLE"
_ACCEPT_SEED_SALT = 0x5EC0_DEC0  # the accept RNG is seeded apart from llama.cpp's dist RNG


@dataclass
class SpecStats:
    """Counters of one generation (or cumulated with ``+=``)."""

    verifications: int = 0      # target verification batches that carried >= 1 draft token
    drafted: int = 0            # draft tokens proposed
    accepted: int = 0           # draft tokens kept
    recovered: int = 0          # tokens emitted at the first rejection
    bonus: int = 0              # tokens drawn from p after all k drafts were kept
    extra_accepted: int = 0     # kept although the target's own sample there was another token
    exact_match_verifications: int = 0  # verifications run with the exact-match rule
    fallback_positions: int = 0  # positions where p was not normalized (exact match used)
    emitted: int = 0
    reached: list[int] = field(default_factory=lambda: [0] * N_MAX_LIMIT)        # per position
    accepted_at: list[int] = field(default_factory=lambda: [0] * N_MAX_LIMIT)    # per position
    expected_accept: list[float] = field(default_factory=lambda: [0.0] * N_MAX_LIMIT)  # sum min(p,q)
    # p(argmax q) at the same positions: what the exact-match rule with an argmax draft accepts
    expected_accept_exact: list[float] = field(default_factory=lambda: [0.0] * N_MAX_LIMIT)
    t_prompt_s: float = 0.0
    t_decode_s: float = 0.0
    n_prompt: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens kept per verification."""
        return self.accepted / self.verifications if self.verifications else 0.0

    @property
    def decode_tps(self) -> float:
        return self.emitted / self.t_decode_s if self.t_decode_s > 0 else 0.0

    def __iadd__(self, o: SpecStats) -> SpecStats:
        for f in ("verifications", "drafted", "accepted", "recovered", "bonus", "extra_accepted",
                  "exact_match_verifications", "fallback_positions", "emitted", "t_prompt_s", "t_decode_s", "n_prompt"):
            setattr(self, f, getattr(self, f) + getattr(o, f))
        for f in ("reached", "accepted_at", "expected_accept", "expected_accept_exact"):
            a, b = getattr(self, f), getattr(o, f)
            setattr(self, f, [x + y for x, y in zip(a, b, strict=True)])
        return self

    def as_dict(self) -> dict:
        n = max((i + 1 for i, r in enumerate(self.reached) if r), default=0)
        return {
            "verifications": self.verifications, "drafted": self.drafted, "accepted": self.accepted,
            "recovered": self.recovered, "bonus": self.bonus, "extra_accepted": self.extra_accepted,
            "exact_match_verifications": self.exact_match_verifications,
            "fallback_positions": self.fallback_positions, "emitted": self.emitted,
            "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
            "reached": self.reached[:n], "accepted_at": self.accepted_at[:n],
            "expected_accept": self.expected_accept[:n],
            "expected_accept_exact": self.expected_accept_exact[:n],
            "n_prompt": self.n_prompt, "t_prompt_s": self.t_prompt_s, "t_decode_s": self.t_decode_s,
            "decode_tps": self.decode_tps,
        }

    def summary(self) -> str:
        return (f"drafted {self.drafted}, accepted {self.accepted} ({100 * self.acceptance_rate:.1f} %), "
                f"mean accepted length {self.mean_accepted_length:.2f}, extra accepted {self.extra_accepted}, "
                f"{self.emitted} tokens at {self.decode_tps:.1f} t/s")


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stop_reason: str           # "eos" | "stop" | "length" | "context_full"
    stats: SpecStats
    prompt_tokens: list[int]
    spec_draft_sample: bool


@dataclass
class TokenEvent:
    token: int
    text: str                  # the new complete UTF-8 text this token finished (may be "")
    accepted_draft: bool


class SpeculativeGenerator:
    """Owns the target context and a drafter; runs requests one after another.

    ``drafter=None`` is plain (non-speculative) generation with the same sampler: the
    reference the speculative modes are tested against.
    """

    def __init__(self, target: Model, drafter: Drafter | None = None, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_threads: int | None = None, n_max: int = 3) -> None:
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
        self.ctx = Context(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_rs_seq=n_rs)
        if drafter is not None:
            drafter.prepare_target(self.ctx)
        self.scratch = _accept.new_scratch(target.n_vocab)
        self._cached_prompt: np.ndarray | None = None
        self.total = SpecStats()
        self.topk_stats = None  # set by llama_spec.stats.TopKStats.attach()

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.ctx.close()

    # ------------------------------------------------------------------------------------------
    def _decode_observed(self, tokens: np.ndarray, pos0: int, outputs) -> np.ndarray:
        logits = self.ctx.decode(tokens, np.arange(pos0, pos0 + len(tokens), dtype=np.int32), 0, outputs)
        if self.drafter is not None:
            self.drafter.observe(tokens, pos0, self.ctx)
        return logits

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        sampling: SamplerParams | None = None,
        n_predict: int = 128,
        seed: int | None = None,
        spec_draft_sample: bool | None = None,
        n_max: int | None = None,
        p_min: float = 0.0,
        stop: Sequence[str] = (),
        reasoning_budget: ReasoningBudget | None = None,
        ignore_eos: bool = False,
        result: list | None = None,
    ) -> Iterator[TokenEvent]:
        """Yield tokens as they are emitted; the final GenerationResult is appended to `result`."""
        sampling = sampling or SamplerParams()
        if seed is not None:
            sampling = sampling.replace(seed=int(seed) & 0xFFFFFFFF)
        if spec_draft_sample is None:
            spec_draft_sample = env_flag(ENV_DRAFT_SAMPLE, True)
        n_max = self.n_max if n_max is None else int(n_max)
        _check_n_max(n_max)
        if self.recurrent and n_max > self.ctx.n_rs_seq:
            raise ValueError(
                f"n_max={n_max} exceeds the n_max={self.ctx.n_rs_seq} this generator was built with: a "
                "recurrent/hybrid target keeps one state snapshot per draft position (build it with a larger n_max)"
            )
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        if n_predict <= 0:
            raise ValueError(f"n_predict must be > 0, got {n_predict}")
        prompt_tokens = self.model.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not prompt_tokens:
            raise ValueError("empty prompt")
        if len(prompt_tokens) >= self.ctx.n_ctx:
            raise ValueError(f"prompt of {len(prompt_tokens)} tokens does not fit the context of n_ctx={self.ctx.n_ctx} tokens")

        sampler = TargetSampler(self.model, sampling,
                                reasoning_budget=reasoning_budget.clone() if reasoning_budget else None)
        self.last_sampler = sampler
        rng = _accept.new_rng_state((sampling.seed ^ _ACCEPT_SEED_SALT) & 0xFFFFFFFF)
        self.last_rng = rng  # the accept RNG state (tests check greedy leaves it untouched)
        drafter = self.drafter
        if drafter is not None:
            drafter.configure(sampling, sampling.seed, sample=bool(spec_draft_sample),
                              collect_topk=self.topk_stats is not None)
        stats = SpecStats(n_prompt=len(prompt_tokens))
        stops = [s for s in stop if s]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text_parts: list[str] = []
        emitted: list[int] = []
        history = list(prompt_tokens)

        # -- prefill (prompt cache: the same prompt as last time re-decodes only its last token) --
        t0 = time.perf_counter()
        toks = np.asarray(prompt_tokens, dtype=np.int32)
        head = toks[:-1]
        hit = self._cached_prompt is not None and np.array_equal(self._cached_prompt, head)
        # Recurrent state can only be rolled back n_rs_seq positions: beyond that, prefill again.
        hit = hit and self.ctx.seq_rm(0, len(head), -1)
        if hit:
            if drafter is not None:
                drafter.restore_prompt(len(head))
        else:
            self._cached_prompt = None
            self.ctx.clear()
            if drafter is not None:
                drafter.begin(prompt_tokens)
            for off in range(0, len(head), self.ctx.n_batch):
                self._decode_observed(head[off : off + self.ctx.n_batch], off, "last")
            if drafter is not None:
                drafter.snapshot_prompt(len(head))
            self._cached_prompt = head.copy()
        row = self._decode_observed(toks[-1:], len(head), "last")[-1]
        t1 = time.perf_counter()
        stats.t_prompt_s = t1 - t0

        stop_reason = None
        tail = ""

        def emit(tok: int, was_draft: bool) -> TokenEvent:
            nonlocal stop_reason, tail
            emitted.append(tok)
            history.append(tok)
            stats.emitted += 1
            piece = decoder.decode(self.model.token_to_piece(tok))
            if piece:
                text_parts.append(piece)
                if stops:
                    tail = (tail + piece)[-(max(map(len, stops)) + len(piece)):]
                    if any(s in tail for s in stops):
                        stop_reason = "stop"
            if stop_reason is None:
                if not ignore_eos and self.model.is_eog(tok):
                    stop_reason = "eos"
                elif len(emitted) >= n_predict:
                    stop_reason = "length"
            return TokenEvent(tok, piece, was_draft)

        # The first token after the prompt is the target's own sample (nothing to verify).
        pq_log = self.pq_log = [] if self.record_pq else None
        if pq_log is not None:
            ids, probs = sampler.candidates(row)
            pq_log.append((0, ids.copy(), probs.copy(), None, None))
        tok = sampler.sample(row)
        sampler.accept(tok)
        yield emit(tok, False)

        while stop_reason is None:
            pos0 = len(history) - 1  # position of the last emitted token (not yet decoded)
            room = self.ctx.n_ctx - 1 - pos0
            if room < 0:
                stop_reason = "context_full"
                break
            k_cap = min(n_max, room, n_predict - len(emitted) - 1)
            prop = drafter.draft(history, k_cap, p_min) if (drafter is not None and k_cap > 0) else Proposal()
            if len(prop) > k_cap:
                del prop.tokens[k_cap:]
            k = len(prop)
            batch = np.asarray([history[-1], *prop.tokens], dtype=np.int32)
            logits = self._decode_observed(batch, pos0, "all")
            if self.on_verify is not None:
                self.on_verify(pos0, batch, logits)
            use_rejection = bool(spec_draft_sample) and k > 0 and prop.has_q and not sampler.has_grammar
            if k > 0:
                stats.verifications += 1
                stats.drafted += k
                if not use_rejection:
                    stats.exact_match_verifications += 1
            n_acc = 0
            events = []
            for i in range(k + 1):
                row = logits[i]
                if i == k:  # bonus: all drafts kept; the target's own draw from p
                    tok = sampler.sample(row)
                    sampler.accept(tok)
                    if k > 0:
                        stats.bonus += 1
                    events.append(emit(tok, False))
                    break
                d = prop.tokens[i]
                stats.reached[i] += 1
                if use_rejection:
                    ids, probs, sampled = sampler.candidates_and_sample(row)
                    if pq_log is not None:
                        qi, qp = prop.q_ids[i], prop.q_probs[i]
                        pq_log.append((len(emitted), ids.copy(), probs.copy(), qi, qp))
                        stats.expected_accept[i] += _sum_min(ids, probs, qi, qp, self.scratch)
                        stats.expected_accept_exact[i] += float(probs[ids == qi[np.argmax(qp)]].sum())
                    if _accept.p_is_normalized(probs) and _accept.p_is_normalized(prop.q_probs[i]):
                        tok, ok = _accept.accept_step_kernel(ids, probs, d, prop.q_ids[i], prop.q_probs[i],
                                                             rng, self.scratch)
                        tok, ok = int(tok), bool(ok)
                        if ok and sampled != d:
                            stats.extra_accepted += 1
                    else:
                        stats.fallback_positions += 1
                        tok, ok = sampled, sampled == d
                else:
                    tok = sampler.sample(row)
                    ok = tok == d
                sampler.accept(tok)
                events.append(emit(tok, ok))
                if ok:
                    n_acc += 1
                    stats.accepted += 1
                    stats.accepted_at[i] += 1
                else:
                    stats.recovered += 1
                if not ok or stop_reason is not None:
                    break
            # Rejected drafts leave no trace: keep [.., last emitted before, kept drafts].
            self.ctx.rollback(0, pos0 + n_acc + 1)
            if drafter is not None:
                drafter.accepted(n_acc)
            if self.topk_stats is not None and k > 0:
                self.topk_stats.record(prop, emitted[-len(events):], n_acc)
            yield from events

        text_parts.append(decoder.decode(b"", final=True))
        text = "".join(text_parts)
        if stop_reason == "stop":
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        stats.t_decode_s = time.perf_counter() - t1
        self.total += stats
        res = GenerationResult(text=text, tokens=emitted, stop_reason=stop_reason, stats=stats,
                               prompt_tokens=prompt_tokens, spec_draft_sample=bool(spec_draft_sample))
        self.last_result = res
        if result is not None:
            result.append(res)

    # Tests and scripts set record_pq to log sum min(p, q) per position into the stats, and
    # (emitted index, p ids, p probs, q ids, q probs) of the last request into pq_log (the first
    # token's entry has q None).
    record_pq = False
    pq_log: list | None = None
    on_verify = None   # optional callback(pos0, batch_tokens, logits_view) after each target batch

    def generate(self, prompt: str | Sequence[int], **kwargs) -> GenerationResult:
        out: list[GenerationResult] = []
        for _ in self.stream(prompt, result=out, **kwargs):
            pass
        return out[0]


def _sum_min(p_ids, p_probs, q_ids, q_probs, scratch) -> float:
    """sum_y min(p(y), q(y)): the rejection rule's acceptance probability at this position."""
    scratch[q_ids] = q_probs
    s = float(np.minimum(p_probs, scratch[p_ids]).sum())
    scratch[q_ids] = 0.0
    return s


def _check_n_max(n_max: int) -> None:
    if not 1 <= int(n_max) <= N_MAX_LIMIT:
        raise ValueError(f"n_max must be in [1, {N_MAX_LIMIT}], got {n_max}")


def generate(target: Model, prompt: str | Sequence[int], *, drafter: Drafter | None = None,
             sampling: SamplerParams | None = None, n_predict: int = 128, seed: int | None = None,
             spec_draft_sample: bool | None = None, n_max: int = 3, p_min: float = 0.0,
             stop: Sequence[str] = (), reasoning_budget: ReasoningBudget | None = None,
             n_ctx: int = 4096, n_threads: int | None = None) -> GenerationResult:
    """One request: build a generator around `target` (and `drafter`), run it, free it."""
    gen = SpeculativeGenerator(target, drafter, n_ctx=n_ctx, n_threads=n_threads, n_max=n_max)
    try:
        return gen.generate(prompt, sampling=sampling, n_predict=n_predict, seed=seed,
                            spec_draft_sample=spec_draft_sample, n_max=n_max, p_min=p_min, stop=stop,
                            reasoning_budget=reasoning_budget)
    finally:
        gen.ctx.close()
