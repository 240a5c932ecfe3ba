"""Reasoning and answer: splitting ``<think>…</think>`` out of a model's output, incrementally.

The splitter works on text pieces as they stream; feeding a text in any number of pieces gives
the same concatenation as feeding it whole, so streamed and non-streamed chats agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..llama.model import Model

__all__ = ["THINK_TAGS", "ThinkSplitter", "opens_inside", "partial_suffix", "split_thinking", "thinking_tags"]

#: Known (start, end) thinking tags, most common first.
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
)


class ThinkSplitter:
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
                n = len(buf) - partial_suffix(buf, self.end)
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


def partial_suffix(text: str, tag: str) -> int:
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
    sp = ThinkSplitter(started_inside, start, end)
    parts = sp.feed(text) + sp.finish()
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    answer = "".join(t for k, t in parts if k == "content")
    return (reasoning if sp.saw_block else None), answer


def thinking_tags(model: Model, template: str | None = None) -> tuple[str, str] | None:
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


def opens_inside(prompt: str, generation_prompt: str, start: str, end: str) -> bool:
    """True when the prompt ends inside an open think block opened by the generation prompt."""
    tail = generation_prompt if generation_prompt else prompt[-256:]
    i = tail.rfind(start)
    return i >= 0 and tail.find(end, i + len(start)) < 0
