"""Perplexity from the binding's logits, computed the way llama.cpp's `llama-perplexity` does.

Chunks of n_ctx tokens (the first replaced by BOS when the model adds one), a fresh memory per
chunk, the negative log-likelihood of the second half of each chunk: float32 logits minus the
max, exp in float32, the sum in double. The result is comparable digit for digit with the
tool's "Final estimate: PPL = ..." line for the same model, text and n_ctx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..llama.context import Context
from ..llama.model import Model


@dataclass
class PerplexityResult:
    ppl: float
    n_chunks: int
    n_tokens_scored: int
    chunk_ppl: list[float]  # running estimate after each chunk, as the tool prints [1]x,[2]y,...


def _nll(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    mx = rows.max(axis=1, keepdims=True)
    z = (rows - mx).astype(np.float32)
    sum_exp = np.exp(z, dtype=np.float32).astype(np.float64).sum(axis=1)
    tok_logit = z[np.arange(len(targets)), targets].astype(np.float64)
    return -tok_logit + np.log(sum_exp)


def perplexity(model: Model, text: str, *, n_ctx: int = 512, n_chunks: int = -1, n_threads: int | None = None,
               progress: bool = False) -> PerplexityResult:
    tokens = np.asarray(model.tokenize(text, add_special=True), dtype=np.int32)
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"need at least {2 * n_ctx} tokens for n_ctx={n_ctx}; the text has {len(tokens)}")
    n_chunk = len(tokens) // n_ctx if n_chunks < 0 else min(n_chunks, len(tokens) // n_ctx)
    first = n_ctx // 2
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads)
    outputs = np.zeros(n_ctx, dtype=bool)
    outputs[first:] = True
    nll, count, running = 0.0, 0, []
    it = range(n_chunk)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="perplexity", unit="chunk")
    try:
        for i in it:
            chunk = tokens[i * n_ctx : (i + 1) * n_ctx].copy()
            bos = model.token_bos
            if model.add_bos and bos is not None:
                chunk[0] = bos
            ctx.clear()
            logits = ctx.decode(chunk, np.arange(n_ctx, dtype=np.int32), 0, outputs)
            # rows first..n_ctx-2 predict tokens first+1..n_ctx-1 (the last row predicts nothing)
            nll += float(_nll(logits[:-1], tokens[i * n_ctx + first + 1 : (i + 1) * n_ctx]).sum())
            count += n_ctx - first - 1
            running.append(math.exp(nll / count))
    finally:
        ctx.close()
    return PerplexityResult(ppl=math.exp(nll / count), n_chunks=n_chunk, n_tokens_scored=count, chunk_ppl=running)
