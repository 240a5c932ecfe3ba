"""``create_completion`` of :class:`llama_spec.Llama`: llama-cpp-python's ``text_completion`` dicts.

Shapes follow llama-cpp-python 0.3.x (``llama_cpp/llama.py``, ``_create_completion``):

* a result: ``{"id": "cmpl-<uuid>", "object": "text_completion", "created", "model", "choices":
  [{"text", "index": 0, "logprobs": None, "finish_reason": "stop" | "length"}], "usage":
  {"prompt_tokens", "completion_tokens", "total_tokens"}}``;
* a stream: chunks of the same shape without ``usage``, ``finish_reason`` None, then a last
  chunk with empty text and the finish reason;

plus ``"speculative"`` (on the result, and on the last chunk of a stream): the verification
rule, the drafter and :meth:`llama_spec.SpecStats.as_dict` (drafted, accepted,
mean_accepted_length, tokens_per_verification, ...).

The prompt is tokenized as llama-cpp-python does: BOS when the vocabulary asks for it, then the
text with special tokens parsed (a list of token ids is used as given). The end-of-generation
token is not part of the text nor counted in ``completion_tokens``; the text stops before the
first stop string.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..chat_api import StopHold
from ..llama.model import Model
from ..llama.sampling import SamplerParams

__all__ = ["CompletionJob", "check_call_defaults", "derive_seed", "grammar_text", "prompt_tokens",
           "sampling_params", "speculative_entry"]

_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED


def grammar_text(grammar: Any) -> str | None:
    """GBNF text from a str or a ``llama_cpp.LlamaGrammar`` (its ``_grammar`` text); None = none."""
    if grammar is None or isinstance(grammar, str):
        return grammar or None
    text = getattr(grammar, "_grammar", None)  # llama_cpp.LlamaGrammar keeps its GBNF source here
    if isinstance(text, str):
        return text
    raise TypeError(f"grammar must be GBNF text or a llama_cpp.LlamaGrammar, got {type(grammar).__name__}")


def check_call_defaults(**given: Any) -> None:
    """TypeError naming a llama-cpp-python call argument that llama-spec only has at its default
    (mirostat_mode=0, tfs_z=1.0, logprobs=None, suffix=None, stopping_criteria=None,
    logits_processor=None, top_logprobs=None)."""
    defaults: dict[str, Any] = {"mirostat_mode": 0, "tfs_z": 1.0, "logprobs": None, "suffix": None,
                                "stopping_criteria": None, "logits_processor": None, "top_logprobs": None}
    why = {"mirostat_mode": "mirostat sampling is not implemented",
           "tfs_z": "tail-free sampling was removed from llama.cpp",
           "logprobs": "logprobs need logits_all, which is out of scope",
           "top_logprobs": "logprobs need logits_all, which is out of scope",
           "suffix": "infill (suffix) prompts are not implemented",
           "stopping_criteria": "Python stopping criteria are not implemented: use stop strings",
           "logits_processor": "Python logits processors are not implemented: use logit_bias or grammar"}
    for name, value in given.items():
        d = defaults[name]
        if name == "logprobs" and value is False:  # the chat form: a bool
            continue
        if value is not None if d is None else value != d:
            raise TypeError(f"{name}={value!r} is not supported by llama-spec ({why[name]})")


def sampling_params(*, temperature: float, top_p: float, top_k: int, min_p: float, typical_p: float,
                    repeat_penalty: float, frequency_penalty: float, presence_penalty: float,
                    penalty_last_n: int, grammar: Any, logit_bias: Mapping[Any, float] | None) -> SamplerParams:
    """llama-cpp-python's sampling arguments as SamplerParams (the same llama.cpp chain:
    logit bias, penalties, grammar, top-k, typical, top-p, min-p with min_keep 1, temperature).
    temperature 0 is greedy; a negative temperature samples the raw softmax, as theirs does."""
    kw: dict[str, Any] = dict(temp=float(temperature), top_p=float(top_p), top_k=int(top_k), min_p=float(min_p),
                              typical_p=float(typical_p))
    if temperature < 0:  # llama-cpp-python: dist only, no truncation (temperature 1)
        kw = dict(temp=1.0, top_p=1.0, top_k=0, min_p=0.0, typical_p=1.0)
    bias = tuple((int(k), float(v)) for k, v in (logit_bias or {}).items())
    return SamplerParams(**kw, min_keep=1, penalty_repeat=float(repeat_penalty), penalty_freq=float(frequency_penalty),
                         penalty_present=float(presence_penalty), penalty_last_n=int(penalty_last_n),
                         grammar=grammar_text(grammar), logit_bias=bias)


def derive_seed(llama_seed: int) -> int:
    """The seed of a call without one, as llama-cpp-python derives it from the Llama's seed
    (``random.Random(seed).randint(0, 2**32)``, which then becomes the Llama's seed)."""
    return random.Random(llama_seed).randint(0, 2**32)


def prompt_tokens(model: Model, prompt: str | Sequence[int]) -> list[int]:
    """The tokens llama-cpp-python feeds for `prompt`: BOS (if the vocabulary adds it) + the text
    with special tokens parsed (+ EOS if the vocabulary adds one); a token list unchanged."""
    if not isinstance(prompt, str):
        return [int(t) for t in prompt]
    toks = model.tokenize(prompt, add_special=False, parse_special=True) if prompt else []
    bos, eos = model.token_bos, model.token_eos
    if model.add_bos and bos is not None:
        toks.insert(0, bos)
    if model.meta("tokenizer.ggml.add_eos_token") == "true" and eos is not None:
        toks.append(eos)
    if not toks and bos is not None:  # an empty prompt: start from BOS as llama-cpp-python does
        toks = [bos]
    return toks


def speculative_entry(result: Any, drafter_name: str | None) -> dict[str, Any]:
    """The ``speculative`` entry: rule, drafter and the run's counters.

    rule: "none" without a drafter; "exact-match" when every verification used it (a drafter
    without q, or the switch off); else the rule asked for ("token" by default).
    """
    st = result.stats
    if drafter_name is None:
        rule = "none"
    elif st.verifications and st.exact_match_verifications == st.verifications:
        rule = "exact-match"
    else:
        rule = result.verify
    return {"rule": rule, "drafter": drafter_name or "none", **st.as_dict()}


def _finish_reason(stop_reason: str) -> str:
    return "length" if stop_reason in ("length", "context_full") else "stop"


@dataclass
class CompletionJob:
    """One completion request, ready to run on a generator (the Llama builds it)."""

    cid: str
    created: int
    model_name: str
    prompt_text: str            # for echo
    tokens: list[int]
    sampling: SamplerParams
    seed: int
    n_predict: int
    stops: list[str]
    echo: bool
    drafter_name: str | None
    spec_kwargs: dict[str, Any]  # n_max / verify for the generator's stream()

    def chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        return {"id": self.cid, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

    def start(self, gen: Any) -> Any:
        """Validate and start the request on `gen` (a SpeculativeGenerator): its stream."""
        return gen.stream(self.tokens, sampling=self.sampling, n_predict=self.n_predict, seed=self.seed,
                          stop=self.stops, **self.spec_kwargs)

    def result(self, stream: Any) -> dict[str, Any]:
        """Run `stream` to its end: the ``text_completion`` dict."""
        for _ in stream:
            pass
        res = stream.result
        out = self.chunk((self.prompt_text if self.echo else "") + res.text, _finish_reason(res.stop_reason))
        n_out = self.n_completion(res)
        out["usage"] = {"prompt_tokens": len(self.tokens), "completion_tokens": n_out,
                        "total_tokens": len(self.tokens) + n_out}
        out["speculative"] = speculative_entry(res, self.drafter_name)
        return out

    def chunks(self, stream: Any) -> Iterator[dict[str, Any]]:
        """The streamed chunks: text that can no longer become part of a stop string, then the
        last chunk (empty text, finish_reason, ``speculative``)."""
        try:
            if self.echo and self.prompt_text:
                yield self.chunk(self.prompt_text, None)
            hold = StopHold(self.stops)
            for ev in stream:
                if ev.text:
                    safe = hold.feed(ev.text)
                    if safe:
                        yield self.chunk(safe, None)
            res = stream.result
            rest = hold.finish(res.text)
            if rest:
                yield self.chunk(rest, None)
            last = self.chunk("", _finish_reason(res.stop_reason))
            last["speculative"] = speculative_entry(res, self.drafter_name)
            yield last
        finally:
            stream.close()  # an abandoned stream gives the generator back

    @staticmethod
    def n_completion(res: Any) -> int:
        """Completion tokens as llama-cpp-python counts them (the end-of-generation token not)."""
        return len(res.tokens) - (1 if res.stop_reason == "eos" else 0)
