"""``draft_model=`` of :class:`llama_spec.Llama`: what it accepts and the drafter it becomes.

* a GGUF path (or a test-model name) or a loaded :class:`~llama_spec.Model`: **draft-simple**
  (:class:`~llama_spec.DraftModelDrafter`; sampled drafts with q, the rejection rule);
* an n-gram ``--spec-type`` name (``"ngram-simple"``, ``"ngram-map-k"``, ``"ngram-mod"``);
* ``"draft-mtp"`` (or ``"mtp"``): the target's own MTP head (the target is loaded with it);
* a ready :class:`~llama_spec.Drafter` (the Llama then owns and closes it);
* any other callable with llama-cpp-python's ``LlamaDraftModel`` signature,
  ``__call__(input_ids: np.ndarray[intc], /, **kwargs) -> np.ndarray`` of draft ids (e.g.
  ``llama_cpp.llama_speculative.LlamaPromptLookupDecoding``): :class:`CallableDrafter`. It gives
  no q, so each of its proposals is verified by the exact-match rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..drafters.base import Drafter, Proposal
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mtp import MtpDrafter
from ..drafters.ngram import NGRAM_SPEC_TYPES, build_ngram_drafter
from ..llama.model import Model
from ..models.registry import resolve_model

__all__ = ["MTP_NAMES", "CallableDrafter", "DraftPlan", "build_draft", "wants_mtp"]

MTP_NAMES = ("draft-mtp", "mtp")
N_MAX_LIMIT = 64  # the generator's largest n_max (llama_spec.generation.solo.N_MAX_LIMIT)
_MODEL_N_MAX = 3  # llama.cpp's --spec-draft-n-max default for model drafters
# n-gram drafters propose as many tokens as their own size knob allows (llama.cpp: size_m / n_max)
_NGRAM_N_MAX = {"ngram-simple": 48, "ngram-map-k": 48, "ngram-mod": 64}

DraftSpec = Drafter | Model | str | os.PathLike[str] | Callable[..., Any] | None


class CallableDrafter(Drafter):
    """A llama-cpp-python ``LlamaDraftModel`` (a callable: token ids -> draft ids) as a Drafter.

    ``draft`` calls ``fn(np.asarray(history, dtype=np.intc))`` — the prompt and every emitted
    token, as llama-cpp-python passes ``input_ids`` — and keeps the first ``n_max`` ids. The
    proposal carries no q, so the verifier uses the exact-match rule: the output is what plain
    decoding with the same seed emits (docs/design.md invariants 3 and 4). An id outside the
    target's vocabulary raises ValueError before it reaches llama.cpp.
    """

    name = "llama-draft-model"
    sample_drafts = False

    def __init__(self, fn: Callable[..., Any], vocab_size: int) -> None:
        if not callable(fn):
            raise TypeError(f"draft_model must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.vocab_size = int(vocab_size)

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        """The callable's draft ids for `history`, cut to n_max; no q (exact-match)."""
        out = np.asarray(self.fn(np.asarray(history, dtype=np.intc)))
        if out.ndim != 1 or (out.size and not np.issubdtype(out.dtype, np.integer)):
            raise ValueError(f"draft_model must return a 1-D array of token ids, got shape {out.shape} "
                             f"dtype {out.dtype}")
        ids = out[:max(0, int(n_max))].astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"draft_model returned a token id outside [0, {self.vocab_size})")
        return Proposal(tokens=[int(t) for t in ids], q_ids=None, q_probs=None)


@dataclass
class DraftPlan:
    """The drafter built for a Llama, the default n_max for it, and what to free on close."""

    drafter: Drafter | None
    n_max: int
    closers: list[Callable[[], None]] = field(default_factory=list)
    mode: str = "none"    # what the `speculative` entry calls the drafter


def wants_mtp(spec: DraftSpec) -> bool:
    """True when `spec` asks for the target's MTP head (the target must be loaded with it)."""
    return isinstance(spec, str) and spec in MTP_NAMES


def build_draft(spec: DraftSpec, target: Model, *, n_ctx: int, n_threads: int | None, n_max: int | None,
                model_kwargs: dict[str, Any]) -> DraftPlan:
    """The drafter for ``draft_model=spec`` on `target` (see the module docstring).

    n_max None = the drafter's own default (3 for model drafters as llama.cpp's
    --spec-draft-n-max, the n-gram size knob, 64 for a callable, whose drafts llama-cpp-python
    never cuts). `model_kwargs` place a draft model loaded from a path as the target is placed.
    """
    if spec is None:
        return DraftPlan(None, n_max or _MODEL_N_MAX)
    if isinstance(spec, Drafter):
        return DraftPlan(spec, n_max or _MODEL_N_MAX, [spec.close], spec.name)
    if isinstance(spec, str) and spec in MTP_NAMES:
        d: Drafter = MtpDrafter(target, n_ctx=n_ctx, n_threads=n_threads)
        return DraftPlan(d, n_max or _MODEL_N_MAX, [d.close], d.name)
    if isinstance(spec, str) and spec in NGRAM_SPEC_TYPES:
        d = build_ngram_drafter(spec)
        return DraftPlan(d, n_max or min(N_MAX_LIMIT, _NGRAM_N_MAX[spec]), [d.close], spec)
    if isinstance(spec, Model):
        k = n_max or _MODEL_N_MAX
        d = DraftModelDrafter(spec, n_ctx=n_ctx, n_threads=n_threads, n_max=k)
        return DraftPlan(d, k, [d.close], d.name)
    if isinstance(spec, (str, os.PathLike)):
        dmodel = Model(resolve_model(spec), **model_kwargs)
        k = n_max or _MODEL_N_MAX
        try:
            d = DraftModelDrafter(dmodel, n_ctx=n_ctx, n_threads=n_threads, n_max=k)
        except BaseException:
            dmodel.close()
            raise
        return DraftPlan(d, k, [d.close, dmodel.close], d.name)
    if callable(spec):
        d = CallableDrafter(spec, target.n_vocab)
        return DraftPlan(d, n_max or N_MAX_LIMIT, [d.close], d.name)
    raise TypeError(f"draft_model must be a GGUF path, a Model, an n-gram type ({', '.join(NGRAM_SPEC_TYPES)}), "
                    f"'draft-mtp', a Drafter or a LlamaDraftModel-style callable; got {type(spec).__name__}")
