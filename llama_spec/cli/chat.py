"""``llama-spec chat``: one message with ``-p``, or a conversation on stdin (the REPL).

Answers go to stdout, reasoning to stderr between ``[reasoning]`` markers, counters to stderr.
Built on :func:`llama_spec.chat` with a generator reused across turns (its prompt cache).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..chat_api import ChatCompletionChunk, chat
from ..chat_api.session import DEFAULT_MAX_TOKENS
from ..generation.solo import GenerationResult, SpeculativeGenerator
from ..llama.sampling import SamplerParams
from .args import add_model_args, add_sampling_args, add_spec_args


def add_parser(sub: Any) -> None:
    c = sub.add_parser("chat", help="chat with a model (REPL, or one-shot with -p)")
    add_model_args(c)
    add_sampling_args(c)
    add_spec_args(c)
    c.add_argument("-p", "--prompt", default=None, help="one-shot user message")
    c.add_argument("-sys", "--system-prompt", default=None)
    c.add_argument("-n", "--n-predict", type=int, default=DEFAULT_MAX_TOKENS)
    c.add_argument("--reasoning-budget", type=int, default=None)
    c.add_argument("--enable-thinking", dest="enable_thinking", action="store_true", default=None)
    c.add_argument("--no-thinking", dest="enable_thinking", action="store_false")
    c.add_argument("-hf", "--hf-repo", default=None, help="Hugging Face repo[:quant] instead of -m")
    c.set_defaults(func=run)


def _print_stats(res: GenerationResult, gen: SpeculativeGenerator, file: TextIO) -> None:
    st = res.stats
    print(f"llama-spec: stop={res.stop_reason} prompt={st.n_prompt} tokens ({st.n_cached} cached), generated={st.emitted} tokens, "
          f"decode {st.decode_tps:.2f} t/s, prefill {st.t_prompt_s:.2f} s", file=file)
    if gen.drafter is not None:
        rule = res.verify
        print(f"llama-spec: rule={rule} {gen.drafter.name}: drafted={st.drafted} accepted={st.accepted} "
              f"({100 * st.acceptance_rate:.1f} %) mean_accepted_length={st.mean_accepted_length:.2f}", file=file)


def _turn(gen: SpeculativeGenerator, messages: list[dict[str, str]], ns: argparse.Namespace, sampling: SamplerParams,
          out: TextIO, err: TextIO) -> tuple[str, str | None]:
    """One streamed turn: answer to ``out``, reasoning to ``err`` between markers."""
    budget = ns.reasoning_budget if ns.reasoning_budget is not None and ns.reasoning_budget >= 0 else None
    it = chat(gen, messages, enable_thinking=ns.enable_thinking, reasoning_budget=budget, sampling=sampling,
              stream=True, max_tokens=ns.n_predict, seed=ns.seed, spec_draft_sample=ns.spec_draft_sample,
              n_max=gen.n_max, p_min=ns.spec_draft_p_min, stop=ns.reverse_prompt or None)
    answer: list[str] = []
    reasoning: list[str] = []
    in_reasoning = False
    last: ChatCompletionChunk | None = None
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


def run(ns: argparse.Namespace) -> int:
    """``llama-spec chat``: one-shot with ``-p``, else a REPL on stdin (``/exit``, ``/reset``)."""
    from ..models.hub import resolve_hf
    from .build import build_generator, finish_topk, sampling_params, save_cost_cache

    if getattr(ns, "hf_repo", None):
        ns.model = str(resolve_hf(ns.hf_repo))
    if not getattr(ns, "model", None):
        print("error: chat needs -m MODEL or -hf REPO[:QUANT]", file=sys.stderr)
        return 2
    out, err = sys.stdout, sys.stderr
    gen, topk = build_generator(ns)
    try:
        sampling = sampling_params(ns)
        system = [{"role": "system", "content": ns.system_prompt}] if ns.system_prompt else []
        if ns.prompt is not None:
            _turn(gen, [*system, {"role": "user", "content": ns.prompt}], ns, sampling, out, err)
            return 0
        history: list[dict[str, str]] = list(system)
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
        save_cost_cache(ns, gen)
        finish_topk(ns, topk)
        gen.close()
