"""draft-mtp: the model's own multi-token-prediction head proposes the draft.

Reproduces upstream's single-head draft-mtp loop (common/speculative.cpp) in Python:

* every target batch is replayed into the MTP context as pairs (x_{p+1}, h_p): token x at
  position p+1 with the target's nextn hidden row of position p (the first token of a batch is
  paired with the row carried over from the previous batch, ``pending_h``);
* a draft step decodes (last token, its hidden row) and reads the head's logits and its own
  hidden row, which is fed forward for the next step;
* after verification ``pending_h`` becomes the target row of the last kept token.

Unlike upstream (which takes ``data[0]``), the draft token is *sampled* from the mirrored
sampler, so q is known.
"""

from __future__ import annotations

import struct

import numpy as np

from ..llama.context import Context, MtpContext
from ..llama.model import Model
from ..llama.sampling import SamplerParams
from .base import Drafter, Proposal, TargetRows, common_prefix
from .mirror import MirrorSampler, ProposalBuilder


class MtpDrafter(Drafter):
    name = "draft-mtp"
    costly = True
    draft_modes = True

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 sample: bool = True, seed: int = 0) -> None:
        if not model.load_mtp or model.n_layer_nextn <= 0:
            raise ValueError(
                f"{model.path}: draft-mtp needs a model with MTP (nextn) layers loaded with load_mtp=True "
                f"(n_layer_nextn={model.n_layer_nextn})"
            )
        self.model = model
        self.vocab_size = model.n_vocab
        self.ctx = MtpContext(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self.n_embd = self.ctx.n_embd
        self.mirror = MirrorSampler(model.n_vocab, model, seed)
        self.sample_drafts = sample
        self.collect_topk = False
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        self._verify_h = np.zeros((0, self.n_embd), dtype=np.float32)
        self._pos0 = 0
        self._pairs = np.zeros((n_batch, self.n_embd), dtype=np.float32)
        self._step_h = np.zeros((1, self.n_embd), dtype=np.float32)
        # what the MTP cells hold, for prompt-prefix reuse: the token at each position and the target's
        # nextn row there (the next position's pair); rows (capacity, n_embd), the first len(_toks) valid
        self._toks: list[int] = []
        self._h = np.zeros((0, self.n_embd), dtype=np.float32)

    def configure(self, params: SamplerParams, seed: int, *, sample: bool = True,
                  collect_topk: bool = False) -> None:
        super().configure(params, seed, sample=sample, collect_topk=collect_topk)
        self.mirror.configure(params)
        self.mirror.reseed(seed)

    def prepare_target(self, target: Context) -> None:
        """The target must hand out nextn rows for every batch token."""
        target.set_nextn(True, masked=False)

    def begin(self, prompt: list[int]) -> None:
        self.ctx.clear()
        self.pending_h[:] = 0.0
        self._toks = []

    def begin_prefix(self, prompt: list[int], n_kept: int) -> int:
        """Keep the MTP cells of the common prefix of theirs and prompt[:n_kept]; the next batch pairs
        with the target's row of the last kept position."""
        m = common_prefix(self._toks, prompt[:n_kept])
        self.ctx.rollback(0, m)
        del self._toks[m:]
        self.pending_h[:] = self._h[m - 1] if m > 0 else 0.0
        return m

    def save_prefix(self) -> bytes | None:
        """The cells' tokens (int64 count, int32 ids), their target rows (float32) and the MTP state."""
        n = len(self._toks)
        return (struct.pack("<q", n) + np.asarray(self._toks, dtype=np.int32).tobytes()
                + np.ascontiguousarray(self._h[:n]).tobytes() + self.ctx.save_state(0))

    def load_prefix(self, data: bytes | None) -> None:
        self.begin([])
        if data is None:
            return
        (n,) = struct.unpack_from("<q", data)
        off = 8 + 4 * n
        rows = np.frombuffer(data, dtype=np.float32, count=n * self.n_embd, offset=off).reshape(n, self.n_embd)
        self.ctx.load_state(data[off + rows.nbytes:], 0)
        self._toks = np.frombuffer(data, dtype=np.int32, count=n, offset=8).tolist()
        self._h = rows.copy()

    def _record(self, tokens: np.ndarray, pos0: int, h: np.ndarray) -> None:
        """The cells from pos0 on now hold `tokens`, with target rows h (n, n_embd)."""
        end = pos0 + len(tokens)
        if len(self._h) < end:
            grown = np.zeros((max(end, 2 * len(self._h), 64), self.n_embd), dtype=np.float32)
            grown[: len(self._h)] = self._h
            self._h = grown
        self._h[pos0:end] = h
        del self._toks[pos0:]
        if len(self._toks) == pos0:
            self._toks.extend(int(t) for t in tokens)

    def snapshot_prompt(self, n_tokens: int) -> None:
        # The row a re-decoded token at position n_tokens pairs with: the target's h at n_tokens - 1
        # (the prompt was observed whole, so take it from the last batch, or the one before it).
        i = n_tokens - 1 - self._pos0
        if 0 <= i < len(self._verify_h):
            self._prompt_h = self._verify_h[i].copy()
        elif i == -1:
            self._prompt_h = self._pairs[0].copy()  # pending_h as the last batch began
        else:
            self._prompt_h = np.zeros(self.n_embd, dtype=np.float32)

    def restore_prompt(self, n_tokens: int) -> None:
        self.ctx.rollback(0, n_tokens)
        del self._toks[n_tokens:]
        self.pending_h[:] = self._prompt_h

    def observe(self, tokens: np.ndarray, pos0: int, target: TargetRows) -> None:
        """Replay a target batch into the MTP context as (x_{p+1}, h_p) pairs."""
        n = len(tokens)
        h = target.nextn_rows(n)
        pairs = self._pairs[:n]
        pairs[0] = self.pending_h
        if n > 1:
            pairs[1:] = h[: n - 1]
        self.ctx.rollback(0, pos0)
        self.ctx.decode(tokens, np.arange(pos0, pos0 + n, dtype=np.int32), 0, np.zeros(n, dtype=bool), embd=pairs)
        self._record(tokens, pos0, h)
        # Rows of this batch, for choosing pending_h once we know how many drafts were kept.
        self._verify_h = h.copy()
        self._pos0 = pos0
        self.pending_h[:] = h[n - 1]

    def accepted(self, n_accepted: int) -> None:
        i = min(n_accepted, len(self._verify_h) - 1)
        if i >= 0:
            self.pending_h[:] = self._verify_h[i]
        # MTP cells beyond the kept prefix belong to rejected drafts.
        self.ctx.rollback(0, self._pos0 + n_accepted + 1)
        del self._toks[self._pos0 + n_accepted + 1:]

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        build = ProposalBuilder(self.mirror, sample=self.sample_drafts, collect_topk=self.collect_topk, p_min=p_min,
                                grammar=self.grammar_clone())  # q masked like p (DESIGN invariant 3)
        pos = len(history) - 1
        tok = history[-1]
        self._step_h[0] = self.pending_h
        for i in range(n_max):
            row = self.ctx.decode([tok], [pos + i], 0, "last", embd=self._step_h)[0]
            h_row = self.ctx.nextn_rows(1)
            nxt = build.add(row)
            if nxt is None:
                break
            tok = nxt
            self._step_h[0] = h_row[0]
        return build.finish()

    def enable_tree(self, shape: tuple[int, ...]) -> None:
        """Trees are refused: the MTP models here are hybrid recurrent (qwen35), and a tree needs one
        recurrent state per path, which llama.cpp cannot branch in one batch (docs/trees.md)."""
        raise ValueError(f"tree: draft-mtp cannot draft trees on {self.model.path}: its model is "
                         f"{'hybrid ' if self.model.is_hybrid else ''}recurrent and llama.cpp keeps one recurrent "
                         "state per sequence set, so the paths of a tree cannot branch in one batch (docs/trees.md)"
                         if self.model.is_recurrent or self.model.is_hybrid else
                         f"tree: draft-mtp trees are not implemented (model {self.model.path})")

    def close(self) -> None:
        self.ctx.close()
