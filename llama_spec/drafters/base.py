"""What every drafter hands the verifier: a proposal (draft tokens + q + support).

A drafter that cannot say which distribution it drew from (an n-gram lookup, say) returns a
proposal with ``q_ids is None``: the loop then uses the exact-match rule for that verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOPK_WIDTH = 8  # candidates remembered per draft position for the top-k statistics


@dataclass
class Proposal:
    """Draft tokens with, per token, q over the drafter's support (the set it sampled from)."""

    tokens: list[int] = field(default_factory=list)
    q_ids: list[np.ndarray] | None = field(default_factory=list)    # int32 per position
    q_probs: list[np.ndarray] | None = field(default_factory=list)  # float32 per position
    # Optional: the drafter's top-8 candidates per position (ids, probs), for draft statistics.
    topk_ids: list[np.ndarray] | None = None
    topk_probs: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def has_q(self) -> bool:
        """True when q is usable by the rejection rule (present, one per draft token)."""
        return (
            self.q_ids is not None
            and self.q_probs is not None
            and len(self.q_ids) == len(self.tokens)
            and len(self.q_probs) == len(self.tokens)
        )


class Drafter:
    """Interface of a drafter, as the speculative loop drives it.

    * ``begin(prompt)`` after the target prefilled the prompt (the drafter prefills itself).
    * ``observe(tokens, pos0, target)`` after every target decode (MTP needs the hidden rows).
    * ``draft(history, n_max, p_min)`` proposes up to n_max tokens continuing `history`
      (prompt + every emitted token; the last one is not yet decoded by the target).
    * ``accepted(n_accepted)`` after verification: how many draft tokens were kept.
    """

    name = "none"
    vocab_size: int = 0

    def begin(self, prompt: list[int]) -> None:  # pragma: no cover - interface
        pass

    def observe(self, tokens: np.ndarray, pos0: int, target) -> None:
        pass

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:  # pragma: no cover
        raise NotImplementedError

    def accepted(self, n_accepted: int) -> None:
        pass

    def snapshot_prompt(self, n_tokens: int) -> None:
        """The target holds the first n_tokens prompt tokens: remember this point."""

    def restore_prompt(self, n_tokens: int) -> None:
        """Go back to the `snapshot_prompt` point (the same prompt is being reused)."""

    def close(self) -> None:
        pass
