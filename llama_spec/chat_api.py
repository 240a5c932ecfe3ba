"""Chat with a model from Python (``llama_spec.chat``) and from the command line (``llama-spec chat``).

The prompt is the GGUF's own ``tokenizer.chat_template`` rendered in a jinja2 sandbox
(:mod:`llama_spec.chat_template`), tokenized with special tokens parsed. Generation runs through
:class:`~llama_spec.speculative.SpeculativeGenerator` (plain, draft model or MTP), and the output
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

import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chat_template import CHATML_TEMPLATE, TemplateError, render_chat_template

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "THINK_TAGS",
    "TemplateError",
    "Usage",
    "chat",
    "cli_chat",
    "prepare_prompt",
    "split_thinking",
    "thinking_tags",
]

#: Known (start, end) thinking tags, most common first.
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
)
DEFAULT_MAX_TOKENS = 512

# ============================================================================ result objects


@dataclass
class ChatMessage:
    role: str = "assistant"
    content: str | None = ""
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            d["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        return d


@dataclass
class Choice:
    index: int
    message: ChatMessage
    finish_reason: str  # "stop" | "length" | "tool_calls"

    def to_dict(self) -> dict:
        return {"index": self.index, "message": self.message.to_dict(), "logprobs": None,
                "finish_reason": self.finish_reason}


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    reasoning_tokens: int = 0

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens,
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}


@dataclass
class ChatCompletion:
    """OpenAI's ``chat.completion`` object, plus ``speculative`` (``SpecStats.as_dict()``).

    ``generation`` is the raw :class:`~llama_spec.speculative.GenerationResult` (tokens, raw text,
    stop reason) and ``prompt`` the rendered prompt; neither goes into ``to_dict()``.
    """

    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    speculative: dict
    object: str = "chat.completion"
    prompt: str = field(default="", repr=False)
    generation: Any = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [c.to_dict() for c in self.choices], "usage": self.usage.to_dict(),
                "speculative": self.speculative}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)


@dataclass
class ChoiceDelta:
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in (("role", self.role), ("content", self.content),
                                  ("reasoning_content", self.reasoning_content),
                                  ("tool_calls", self.tool_calls)) if v is not None}


@dataclass
class ChunkChoice:
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None

    def to_dict(self) -> dict:
        return {"index": self.index, "delta": self.delta.to_dict(), "logprobs": None,
                "finish_reason": self.finish_reason}


@dataclass
class ChatCompletionChunk:
    """One streamed piece (``chat.completion.chunk``); the last one carries finish_reason and usage."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    speculative: dict | None = None
    object: str = "chat.completion.chunk"
    #: On the last chunk: the raw GenerationResult (tokens, raw text, stop reason).
    generation: Any = field(default=None, repr=False)
    _meta: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
             "choices": [c.to_dict() for c in self.choices]}
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        if self.speculative is not None:
            d["speculative"] = self.speculative
        return d


# ============================================================================ thinking


class _ThinkSplitter:
    """Incremental ``<think>…</think>`` splitter: feed text, get ("reasoning"|"content", text) deltas.

    Reasoning is stripped of surrounding whitespace and the answer of leading whitespace; text
    that may still turn into a tag is held back. Feeding a text in any number of pieces gives
    the same concatenation as feeding it whole.
    """

    def __init__(self, started_inside: bool, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end = start, end
        self.state = "lead" if started_inside else "pre"
        self.saw_block = bool(started_inside)
        self.buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while True:
            st, buf = self.state, self.buf
            if st == "pre":
                s = buf.lstrip()
                if s.startswith(self.start):
                    self.state, self.buf, self.saw_block = "lead", s[len(self.start):], True
                    continue
                if not final and (not s or self.start.startswith(s)):
                    return out  # maybe the start tag, not yet complete
                if buf:
                    out.append(("content", buf))
                self.state, self.buf = "answer", ""
                return out
            if st in ("lead", "answer_lead"):
                s = buf.lstrip()
                if not s:
                    self.buf = ""
                    return out
                self.state, self.buf = ("reasoning" if st == "lead" else "answer"), s
                continue
            if st == "reasoning":
                i = buf.find(self.end)
                if i >= 0:
                    r = buf[:i].rstrip()
                    if r:
                        out.append(("reasoning", r))
                    self.state, self.buf = "answer_lead", buf[i + len(self.end):]
                    continue
                if final:
                    r = buf.rstrip()
                    if r:
                        out.append(("reasoning", r))
                    self.buf = ""
                    return out
                n = len(buf) - _partial_suffix(buf, self.end)
                while n > 0 and buf[n - 1].isspace():
                    n -= 1
                if n > 0:
                    out.append(("reasoning", buf[:n]))
                    self.buf = buf[n:]
                return out
            # answer
            if buf:
                out.append(("content", buf))
            self.buf = ""
            return out


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def split_thinking(text: str, started_inside: bool, *, start: str = "<think>",
                   end: str = "</think>") -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a model output.

    ``started_inside``: the prompt already opened the think block (the output starts inside
    it). Otherwise a think block is recognised only at the start of the output (after
    whitespace). ``reasoning`` is ``None`` when there is no think block; a block that never
    closes is all reasoning (the answer is then ``""``).
    """
    sp = _ThinkSplitter(started_inside, start, end)
    parts = sp.feed(text) + sp.finish()
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    answer = "".join(t for k, t in parts if k == "content")
    return (reasoning if sp.saw_block else None), answer


def thinking_tags(model, template: str | None = None) -> tuple[str, str] | None:
    """The (start, end) thinking tags of a model: the first known pair its template mentions,
    else one its vocabulary holds as single tokens, else ``None``."""
    tmpl = template if template is not None else (model.chat_template or "")
    for s, e in THINK_TAGS:
        if s in tmpl and e in tmpl:
            return s, e
    for s, e in THINK_TAGS:
        try:
            ts = model.tokenize(s, add_special=False, parse_special=True)
            te = model.tokenize(e, add_special=False, parse_special=True)
        except Exception:  # noqa: BLE001
            continue
        if len(ts) == 1 and len(te) == 1:
            return s, e
    return None


def _opens_inside(prompt: str, generation_prompt: str, start: str, end: str) -> bool:
    """True when the prompt ends inside an open think block opened by the generation prompt."""
    tail = generation_prompt if generation_prompt else prompt[-256:]
    i = tail.rfind(start)
    return i >= 0 and tail.find(end, i + len(start)) < 0


# ============================================================================ tool calls

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _parse_tool_calls(answer: str) -> tuple[str | None, list[dict]]:
    """Hermes/Qwen ``<tool_call>{json}</tool_call>`` blocks -> OpenAI tool_calls (others kept as text)."""
    calls = []
    for m in _TOOL_CALL_RE.finditer(answer):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or "name" not in obj:
            continue
        args = obj.get("arguments", {})
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": str(obj["name"]),
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    if not calls:
        return answer, []
    rest = _TOOL_CALL_RE.sub("", answer).strip()
    return (rest or None), calls


# ============================================================================ preparing a request


@dataclass
class PreparedPrompt:
    text: str
    tokens: list[int]
    started_inside: bool
    tags: tuple[str, str]
    has_thinking: bool  # the template/model knows thinking tags


def prepare_prompt(model, messages: Sequence[Mapping[str, Any]], *, enable_thinking: bool | None = None,
                   tools: Sequence[Mapping[str, Any]] | None = None, chat_template: str | None = None,
                   add_generation_prompt: bool = True, **template_kwargs) -> PreparedPrompt:
    """Render the model's template for ``messages`` and tokenize it (special tokens parsed)."""
    tmpl = chat_template or model.chat_template or CHATML_TEMPLATE
    bos = model.token_bos
    eos = model.token_eos
    bos_text = model.token_text(bos) if bos is not None else ""
    eos_text = model.token_text(eos) if eos is not None else ""
    kw = dict(bos_token=bos_text, eos_token=eos_text, enable_thinking=enable_thinking, tools=tools,
              **template_kwargs)
    text = render_chat_template(tmpl, messages, add_generation_prompt=add_generation_prompt, **kw)
    gen_prompt = ""
    if add_generation_prompt:
        try:
            base = render_chat_template(tmpl, messages, add_generation_prompt=False, **kw)
        except TemplateError:
            base = ""
        if base and text.startswith(base):
            gen_prompt = text[len(base):]
    found = thinking_tags(model, tmpl)
    tags = found or THINK_TAGS[0]
    started_inside = _opens_inside(text, gen_prompt, *tags) if found else False
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    if model.add_bos and bos is not None and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)  # the vocabulary wants BOS and the template did not write it
    return PreparedPrompt(text=text, tokens=tokens, started_inside=started_inside, tags=tags,
                          has_thinking=found is not None)


def _make_budget(model, prep: PreparedPrompt, budget, message: str):
    from .sampling import ReasoningBudget

    if isinstance(budget, ReasoningBudget):
        return budget
    if budget is None or int(budget) < 0:
        return None
    start, end = prep.tags
    tok = lambda s: model.tokenize(s, add_special=False, parse_special=True)  # noqa: E731
    forced = tok(f"{message}\n{end}\n\n")
    return ReasoningBudget(model, start=[tok(start)], end=[tok(end)], forced=forced, budget=int(budget),
                           initial_state="counting" if prep.started_inside else "idle")


class _StopHold:
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
                safe = min(safe, len(self.raw) - _partial_suffix(self.raw, s))
        out = self.raw[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out

    def finish(self, final_text: str) -> str:
        out = final_text[self.sent:] if len(final_text) > self.sent else ""
        self.sent = max(self.sent, len(final_text))
        return out


def _finish_reason(stop_reason: str) -> str:
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


class _Session:
    """Who owns what for one chat() call: the generator, maybe a model and a drafter."""

    def __init__(self, model, want_mtp: bool) -> None:
        from .model import Model
        from .speculative import SpeculativeGenerator

        self._close: list = []
        self.gen = None
        if isinstance(model, SpeculativeGenerator):
            self.gen = model
            self.model = model.model
        elif isinstance(model, Model):
            self.model = model
        else:
            from .testing.models import resolve_model

            self.model = Model(resolve_model(model), load_mtp=want_mtp)
            self._close.append(self.model.close)

    def start(self, drafter, n_ctx: int, n_threads: int | None, n_max: int) -> None:
        """Build the drafter and the generator (nothing to do for a caller's generator)."""
        from .model import Model
        from .speculative import SpeculativeGenerator

        if self.gen is not None:
            if drafter is not None:
                raise ValueError("pass the drafter to the SpeculativeGenerator, not to chat()")
            return
        d = None
        if isinstance(drafter, str) and drafter == "mtp":
            from .drafters.mtp import MtpDrafter

            d = MtpDrafter(self.model, n_ctx=n_ctx, n_threads=n_threads)
            self._close.insert(0, d.close)
        elif isinstance(drafter, Model):
            from .drafters.draft_model import DraftModelDrafter

            d = DraftModelDrafter(drafter, n_ctx=n_ctx, n_threads=n_threads)
            self._close.insert(0, d.close)
        elif isinstance(drafter, (str, os.PathLike)):
            from .drafters.draft_model import DraftModelDrafter
            from .testing.models import resolve_model

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


def chat(
    model,
    messages: Sequence[Mapping[str, Any]],
    *,
    enable_thinking: bool | None = None,
    reasoning_budget=None,
    reasoning_budget_message: str = "",
    drafter=None,
    sampling=None,
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
    block (``None``/negative: unlimited), or a ready :class:`~llama_spec.sampling.ReasoningBudget`.
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
        budget = _make_budget(sess.model, prep, reasoning_budget, reasoning_budget_message)
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
    last = None
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
    calls: list[dict] = []
    msg_content: str | None = answer
    if tools_given:
        msg_content, calls = _parse_tool_calls(answer)
    finish = last.choices[0].finish_reason or "stop"
    if calls and finish == "stop":
        finish = "tool_calls"
    msg = ChatMessage(content=msg_content, reasoning_content="".join(reasoning) if saw_block else None,
                      tool_calls=calls or None)
    return ChatCompletion(id=last.id, created=last.created, model=last.model,
                          choices=[Choice(0, msg, finish)], usage=last.usage, speculative=last.speculative or {},
                          prompt=prep.text, generation=res)


def _run(sess: _Session, prep: PreparedPrompt, budget, *, sampling, tools_given: bool, max_tokens: int,
         stops: list[str], seed, spec_draft_sample, n_max: int, p_min: float) -> Iterator[ChatCompletionChunk]:
    from .sampling import SamplerParams

    try:
        m = sess.model
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = m.path.name

        def chunk(**kw) -> ChatCompletionChunk:
            fr = kw.pop("finish_reason", None)
            return ChatCompletionChunk(id=cid, created=created, model=name,
                                       choices=[ChunkChoice(0, ChoiceDelta(**kw), fr)])

        yield chunk(role="assistant", content="")
        hold = _StopHold(stops)
        splitter = _ThinkSplitter(prep.started_inside, *prep.tags)
        out: list = []

        def deltas(parts):
            for kind, text in parts:
                if kind == "reasoning":
                    yield chunk(reasoning_content=text)
                else:
                    yield chunk(content=text)

        for ev in sess.gen.stream(prep.tokens, sampling=sampling or SamplerParams(), n_predict=max_tokens,
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
        final.usage = Usage(n_prompt, n_out, n_prompt + n_out, n_reason)
        final.speculative = res.stats.as_dict()
        final.generation = res
        final._meta = (prep, tools_given, splitter.saw_block)
        yield final
    finally:
        sess.close()


# ============================================================================ CLI


def _print_stats(res, gen, file) -> None:
    st = res.stats
    print(f"llama-spec: stop={res.stop_reason} prompt={st.n_prompt} tokens, generated={st.emitted} tokens, "
          f"decode {st.decode_tps:.2f} t/s, prefill {st.t_prompt_s:.2f} s", file=file)
    if gen.drafter is not None:
        rule = "rejection" if res.spec_draft_sample else "exact-match"
        print(f"llama-spec: rule={rule} {gen.drafter.name}: drafted={st.drafted} accepted={st.accepted} "
              f"({100 * st.acceptance_rate:.1f} %) mean_accepted_length={st.mean_accepted_length:.2f}", file=file)


def _turn(gen, messages, ns, sampling, out, err) -> tuple[str, str | None]:
    """One streamed turn: answer to ``out``, reasoning to ``err`` between markers."""
    budget = ns.reasoning_budget if ns.reasoning_budget is not None and ns.reasoning_budget >= 0 else None
    it = chat(gen, messages, enable_thinking=ns.enable_thinking, reasoning_budget=budget, sampling=sampling,
              stream=True, max_tokens=ns.n_predict, seed=ns.seed, spec_draft_sample=ns.spec_draft_sample,
              n_max=ns.spec_draft_n_max, p_min=ns.spec_draft_p_min)
    answer: list[str] = []
    reasoning: list[str] = []
    in_reasoning = False
    last = None
    for ch in it:
        d = ch.choices[0].delta
        if d.reasoning_content:
            if not in_reasoning:
                err.write("[reasoning]\n")
                in_reasoning = True
            reasoning.append(d.reasoning_content)
            err.write(d.reasoning_content)
            err.flush()
        if d.content:
            if in_reasoning:
                err.write("\n[/reasoning]\n")
                err.flush()
                in_reasoning = False
            answer.append(d.content)
            out.write(d.content)
            out.flush()
        last = ch
    if in_reasoning:
        err.write("\n[/reasoning]\n")
    out.write("\n")
    out.flush()
    if last is not None and last.generation is not None:
        _print_stats(last.generation, gen, err)
    return "".join(answer), ("".join(reasoning) if reasoning else None)


def cli_chat(ns) -> int:
    """``llama-spec chat``: one-shot with ``-p``, else a REPL on stdin (``/exit``, ``/reset``)."""
    from .cli import _finish_topk, _sampling, build_generator

    if getattr(ns, "hf_repo", None):
        from .hub import resolve_hf

        ns.model = str(resolve_hf(ns.hf_repo))
    if not getattr(ns, "model", None):
        print("error: chat needs -m MODEL or -hf REPO[:QUANT]", file=sys.stderr)
        return 2
    out, err = sys.stdout, sys.stderr
    gen, topk = build_generator(ns)
    try:
        sampling = _sampling(ns)
        system = [{"role": "system", "content": ns.system_prompt}] if ns.system_prompt else []
        if ns.prompt is not None:
            _turn(gen, [*system, {"role": "user", "content": ns.prompt}], ns, sampling, out, err)
            return 0
        history: list[dict] = list(system)
        interactive = sys.stdin.isatty()
        if interactive:
            print("llama-spec chat: /exit to quit, /reset to clear the conversation", file=err)
        while True:
            if interactive:
                err.write("> ")
                err.flush()
            line = sys.stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            while text.endswith("\\"):  # a trailing backslash continues the message
                more = sys.stdin.readline()
                if not more:
                    break
                text = text[:-1] + "\n" + more.rstrip("\n")
            cmd = text.strip()
            if cmd in ("/exit", "/quit"):
                break
            if cmd == "/reset":
                history = list(system)
                continue
            if not cmd:
                continue
            history.append({"role": "user", "content": text})
            answer, reasoning = _turn(gen, history, ns, sampling, out, err)
            msg = {"role": "assistant", "content": answer}
            if reasoning is not None:
                msg["reasoning_content"] = reasoning
            history.append(msg)
        return 0
    finally:
        _finish_topk(ns, topk)
        gen.close()
