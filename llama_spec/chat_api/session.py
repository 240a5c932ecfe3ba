"""One chat turn: :func:`chat` renders the template, generates, and splits reasoning from the answer.

The prompt is the GGUF's own ``tokenizer.chat_template`` rendered in a jinja2 sandbox
(:mod:`llama_spec.chat.template`), tokenized with special tokens parsed. Generation runs through
:class:`~llama_spec.generation.solo.SpeculativeGenerator` (plain, draft model or MTP), and the output
is split into reasoning (``<think>…</think>``) and answer, also when the template already opened
the think block in the prompt (Qwen3: the output then starts inside it).

``reasoning_budget=N`` installs llama.cpp's reasoning-budget sampler: after N tokens inside the
think block it forces ``reasoning_budget_message + "\\n</think>\\n\\n"`` token by token. Its
start/end sequences are the thinking tags of the template/model tokenized with special tokens;
it starts in ``"counting"`` when the rendered prompt ends inside an open think block.

The result is an OpenAI-shaped :class:`ChatCompletion` (``.to_dict()`` gives the JSON) with our
speculative counters in ``.speculative``; ``stream=True`` yields :class:`ChatCompletionChunk`
objects whose deltas concatenate to exactly the non-streaming result for the same seed (both
paths run the same incremental splitter).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from ..drafters.base import Drafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mtp import MtpDrafter
from ..generation.solo import SpeculativeGenerator
from ..llama.model import Model
from ..llama.sampling import ReasoningBudget, SamplerParams
from ..models.registry import resolve_model
from ..types import FinishReason
from .prompt import PreparedPrompt, make_budget, prepare_prompt
from .results import ChatCompletion, ChatCompletionChunk, ChatMessage, Choice, ChoiceDelta, ChunkChoice, Usage
from .thinking import ThinkSplitter, partial_suffix
from .tools import parse_tool_calls

__all__ = ["DEFAULT_MAX_TOKENS", "StopHold", "chat"]

DEFAULT_MAX_TOKENS = 512


class StopHold:
    """Emit only raw text that cannot become part of a stop string; cut at the first stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.raw = ""
        self.sent = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.raw += piece
        safe = len(self.raw)
        for s in self.stops:
            i = self.raw.find(s)
            if i >= 0:
                safe = min(safe, i)
                self.stopped = True
            else:
                safe = min(safe, len(self.raw) - partial_suffix(self.raw, s))
        out = self.raw[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out

    def finish(self, final_text: str) -> str:
        out = final_text[self.sent:] if len(final_text) > self.sent else ""
        self.sent = max(self.sent, len(final_text))
        return out


def _finish_reason(stop_reason: str) -> FinishReason:
    return "length" if stop_reason in ("length", "context_full") else "stop"


def _reasoning_tokens(tokens: list[int], end_seq: list[int], saw_block: bool) -> int:
    """Completion tokens before the first end-tag sequence (all of them if the block never closed)."""
    if not saw_block:
        return 0
    n = len(end_seq)
    for i in range(len(tokens) - n + 1):
        if n and tokens[i:i + n] == end_seq:
            return i
    return len(tokens)


# ============================================================================ chat()


#: What chat() runs on: a loaded model, a GGUF path or named model, or a ready generator.
ChatModel = Model | SpeculativeGenerator | str | os.PathLike[str]
#: The drafter chat() uses: none, "mtp", a draft model (loaded, or a path/name) or a ready Drafter.
DrafterSpec = Drafter | Model | str | os.PathLike[str] | None


class _Session:
    """Who owns what for one chat() call: the generator, maybe a model and a drafter."""

    def __init__(self, model: ChatModel, want_mtp: bool) -> None:
        self._close: list[Callable[[], None]] = []
        self.gen: SpeculativeGenerator | None = None
        if isinstance(model, SpeculativeGenerator):
            self.gen = model
            self.model = model.model
        elif isinstance(model, Model):
            self.model = model
        else:
            self.model = Model(resolve_model(model), load_mtp=want_mtp)
            self._close.append(self.model.close)

    def start(self, drafter: DrafterSpec, n_ctx: int, n_threads: int | None, n_max: int) -> None:
        """Build the drafter and the generator (nothing to do for a caller's generator)."""
        if self.gen is not None:
            if drafter is not None:
                raise ValueError("pass the drafter to the SpeculativeGenerator, not to chat()")
            return
        d: Drafter | None = None
        if isinstance(drafter, str) and drafter == "mtp":
            d = MtpDrafter(self.model, n_ctx=n_ctx, n_threads=n_threads)
            self._close.insert(0, d.close)
        elif isinstance(drafter, Model):
            d = DraftModelDrafter(drafter, n_ctx=n_ctx, n_threads=n_threads)
            self._close.insert(0, d.close)
        elif isinstance(drafter, (str, os.PathLike)):
            dm = Model(resolve_model(drafter))
            self._close.insert(0, dm.close)
            d = DraftModelDrafter(dm, n_ctx=n_ctx, n_threads=n_threads)
            self._close.insert(0, d.close)
        elif drafter is not None:
            d = drafter  # a Drafter instance: the caller owns it
        self.gen = SpeculativeGenerator(self.model, d, n_ctx=n_ctx, n_threads=n_threads, n_max=n_max)
        self._close.insert(0, self.gen.ctx.close)

    def close(self) -> None:
        fns, self._close = self._close, []
        for fn in fns:
            fn()


@overload
def chat(
    model: ChatModel,
    messages: Sequence[Mapping[str, Any]],
    *,
    enable_thinking: bool | None = None,
    reasoning_budget: int | ReasoningBudget | None = None,
    reasoning_budget_message: str = "",
    drafter: DrafterSpec = None,
    sampling: SamplerParams | None = None,
    stream: Literal[False] = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
    spec_draft_sample: bool | None = None,
    n_ctx: int = 4096,
    n_max: int = 3,
    p_min: float = 0.0,
    n_threads: int | None = None,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatCompletion: ...


@overload
def chat(
    model: ChatModel,
    messages: Sequence[Mapping[str, Any]],
    *,
    enable_thinking: bool | None = None,
    reasoning_budget: int | ReasoningBudget | None = None,
    reasoning_budget_message: str = "",
    drafter: DrafterSpec = None,
    sampling: SamplerParams | None = None,
    stream: Literal[True],
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
    spec_draft_sample: bool | None = None,
    n_ctx: int = 4096,
    n_max: int = 3,
    p_min: float = 0.0,
    n_threads: int | None = None,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Iterator[ChatCompletionChunk]: ...


def chat(
    model: ChatModel,
    messages: Sequence[Mapping[str, Any]],
    *,
    enable_thinking: bool | None = None,
    reasoning_budget: int | ReasoningBudget | None = None,
    reasoning_budget_message: str = "",
    drafter: DrafterSpec = None,
    sampling: SamplerParams | None = None,
    stream: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stop: str | Sequence[str] | None = None,
    seed: int | None = None,
    spec_draft_sample: bool | None = None,
    n_ctx: int = 4096,
    n_max: int = 3,
    p_min: float = 0.0,
    n_threads: int | None = None,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatCompletion | Iterator[ChatCompletionChunk]:
    """One chat turn: render the model's template, generate, split reasoning from the answer.

    ``model``: a :class:`~llama_spec.Model`, a GGUF path or test-model name (loaded and freed
    here), or a :class:`~llama_spec.SpeculativeGenerator` (reused: prompt cache, its drafter).
    ``drafter``: ``None`` (plain decoding), a draft :class:`~llama_spec.Model` or path/name
    (draft-simple), ``"mtp"`` (the target's MTP head; a path ``model`` is then loaded with
    ``load_mtp=True``) or a ready Drafter. ``sampling``: :class:`~llama_spec.SamplerParams`
    (default: llama.cpp's defaults, temp 0.8). ``reasoning_budget``: max tokens inside the think
    block (``None``/negative: unlimited), or a ready :class:`~llama_spec.llama.sampling.ReasoningBudget`.
    ``stop``: strings that end the answer (not included). ``stream=True`` returns an iterator of
    :class:`ChatCompletionChunk`.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    sess = _Session(model, want_mtp=isinstance(drafter, str) and drafter == "mtp")
    try:
        # Render first: a bad template fails before any context is allocated.
        prep = prepare_prompt(sess.model, messages, enable_thinking=enable_thinking, tools=tools,
                              chat_template=chat_template, **dict(template_kwargs or {}))
        budget = make_budget(sess.model, prep, reasoning_budget, reasoning_budget_message)
        sess.start(drafter, n_ctx, n_threads, n_max)
    except BaseException:
        sess.close()
        raise
    it = _run(sess, prep, budget, sampling=sampling, tools_given=tools is not None, max_tokens=max_tokens,
              stops=stops, seed=seed, spec_draft_sample=spec_draft_sample, n_max=n_max, p_min=p_min)
    if stream:
        return it
    return _collect(it)


def _collect(it: Iterator[ChatCompletionChunk]) -> ChatCompletion:
    reasoning: list[str] = []
    content: list[str] = []
    last: ChatCompletionChunk | None = None
    for ch in it:
        d = ch.choices[0].delta
        if d.reasoning_content:
            reasoning.append(d.reasoning_content)
        if d.content:
            content.append(d.content)
        last = ch
    assert last is not None and last._meta is not None
    prep, tools_given, saw_block = last._meta
    res = last.generation
    answer = "".join(content)
    calls: list[dict[str, Any]] = []
    msg_content: str | None = answer
    if tools_given:
        msg_content, calls = parse_tool_calls(answer)
    finish: FinishReason = last.choices[0].finish_reason or "stop"
    if calls and finish == "stop":
        finish = "tool_calls"
    msg = ChatMessage(content=msg_content, reasoning_content="".join(reasoning) if saw_block else None,
                      tool_calls=calls or None)
    assert last.usage is not None  # the last chunk carries the usage
    return ChatCompletion(id=last.id, created=last.created, model=last.model,
                          choices=[Choice(0, msg, finish)], usage=last.usage, speculative=last.speculative or {},
                          prompt=prep.text, generation=res)


def _run(sess: _Session, prep: PreparedPrompt, budget: ReasoningBudget | None, *, sampling: SamplerParams | None,
         tools_given: bool, max_tokens: int, stops: list[str], seed: int | None, spec_draft_sample: bool | None,
         n_max: int, p_min: float) -> Iterator[ChatCompletionChunk]:
    """The chunks of one turn (the generator runs lazily; the session is closed at the end)."""
    assert sess.gen is not None
    gen = sess.gen
    try:
        m = sess.model
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = m.path.name

        def chunk(**kw: Any) -> ChatCompletionChunk:
            fr = kw.pop("finish_reason", None)
            return ChatCompletionChunk(id=cid, created=created, model=name,
                                       choices=[ChunkChoice(0, ChoiceDelta(**kw), fr)])

        yield chunk(role="assistant", content="")
        hold = StopHold(stops)
        splitter = ThinkSplitter(prep.started_inside, *prep.tags)
        out: list[Any] = []

        def deltas(parts: list[tuple[str, str]]) -> Iterator[ChatCompletionChunk]:
            for kind, text in parts:
                if kind == "reasoning":
                    yield chunk(reasoning_content=text)
                else:
                    yield chunk(content=text)

        for ev in gen.stream(prep.tokens, sampling=sampling or SamplerParams(), n_predict=max_tokens,
                                  seed=seed, spec_draft_sample=spec_draft_sample, n_max=n_max, p_min=p_min,
                                  stop=stops, reasoning_budget=budget, result=out):
            if ev.text:
                safe = hold.feed(ev.text)
                if safe:
                    yield from deltas(splitter.feed(safe))
        res = out[0]
        rest = hold.finish(res.text)
        yield from deltas(splitter.feed(rest) + splitter.finish())

        end_seq = m.tokenize(prep.tags[1], add_special=False, parse_special=True)
        n_reason = _reasoning_tokens(res.tokens, end_seq, splitter.saw_block)
        n_prompt, n_out = len(res.prompt_tokens), len(res.tokens)
        final = chunk(finish_reason=_finish_reason(res.stop_reason))
        final.usage = Usage(n_prompt, n_out, n_prompt + n_out, n_reason, cached_tokens=res.cached_tokens)
        final.speculative = res.stats.as_dict()
        final.generation = res
        final._meta = (prep, tools_given, splitter.saw_block)
        yield final
    finally:
        sess.close()
