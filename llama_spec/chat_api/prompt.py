"""Preparing one chat request: the model's template rendered and tokenized, and its reasoning budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TemplateError
from ..llama.model import Model
from ..llama.sampling import ReasoningBudget
from .template import CHATML_TEMPLATE, render_chat_template
from .thinking import THINK_TAGS, opens_inside, thinking_tags

__all__ = ["PreparedPrompt", "make_budget", "prepare_prompt"]


@dataclass
class PreparedPrompt:
    """A rendered, tokenized prompt and what the output splitter needs to know about it."""

    text: str
    tokens: list[int]
    started_inside: bool
    tags: tuple[str, str]
    has_thinking: bool  # the template/model knows thinking tags


def prepare_prompt(model: Model, messages: Sequence[Mapping[str, Any]], *, enable_thinking: bool | None = None,
                   tools: Sequence[Mapping[str, Any]] | None = None, chat_template: str | None = None,
                   add_generation_prompt: bool = True, **template_kwargs: Any) -> PreparedPrompt:
    """Render the model's template for ``messages`` and tokenize it (special tokens parsed)."""
    tmpl = chat_template or model.chat_template or CHATML_TEMPLATE
    bos = model.token_bos
    eos = model.token_eos
    bos_text = model.token_text(bos) if bos is not None else ""
    eos_text = model.token_text(eos) if eos is not None else ""
    kw: dict[str, Any] = dict(bos_token=bos_text, eos_token=eos_text, enable_thinking=enable_thinking, tools=tools,
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
    started_inside = opens_inside(text, gen_prompt, *tags) if found else False
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    if model.add_bos and bos is not None and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)  # the vocabulary wants BOS and the template did not write it
    return PreparedPrompt(text=text, tokens=tokens, started_inside=started_inside, tags=tags,
                          has_thinking=found is not None)


def make_budget(model: Model, prep: PreparedPrompt, budget: int | ReasoningBudget | None,
                message: str) -> ReasoningBudget | None:
    """The reasoning-budget sampler for `budget` tokens (None/negative: none) on this prompt's tags."""
    if isinstance(budget, ReasoningBudget):
        return budget
    if budget is None or int(budget) < 0:
        return None
    start, end = prep.tags

    def tok(s: str) -> list[int]:
        return model.tokenize(s, add_special=False, parse_special=True)

    forced = tok(f"{message}\n{end}\n\n")
    return ReasoningBudget(model, start=[tok(start)], end=[tok(end)], forced=forced, budget=int(budget),
                           initial_state="counting" if prep.started_inside else "idle")
