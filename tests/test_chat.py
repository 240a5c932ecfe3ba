"""Issue 8: chat from Python and the CLI — sandboxed templates, thinking split, reasoning budget,
OpenAI-shaped results, streaming, stop strings, models by Hugging Face id (offline cache)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_spec.chat_api.template import CHATML_TEMPLATE, TemplateError, render_chat_template

ROOT = Path(__file__).resolve().parent.parent

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant. Answer in one line."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "6."},
    {"role": "user", "content": "Name a prime between 10 and 15, with \"quotes\" & <tags>."},
]


# ============================================================================ templates (no model)


def test_helpers_real_templates_need():
    t = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}:{{ m['content'] }}]{% endfor %}"
        "|{{ tools | tojson }}|{{ {'b': '<é>', 'a': 1} | tojson(sort_keys=True) }}"
        "|{{ [1, 2] | tojson(indent=2) }}|{{ strftime_now('%Y') | length }}"
        "{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}"
    )
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    out = render_chat_template(t, msgs, bos_token="<s>", eos_token="</s>", tools=[{"name": "f", "x": "<&>"}])
    # HF tojson: plain json.dumps (jinja2's own would escape <, >, & and ')
    assert out == ('<s>[user:u]|[{"name": "f", "x": "<&>"}]|{"a": 1, "b": "<é>"}|[\n  1,\n  2\n]|4<gen></s>')
    assert render_chat_template(t, msgs, add_generation_prompt=False).endswith("|4")


def test_raise_exception_and_errors_are_template_errors():
    with pytest.raises(TemplateError, match="raised an exception: roles must alternate"):
        render_chat_template("{{ raise_exception('roles must alternate') }}", [])
    with pytest.raises(TemplateError, match="does not compile: line 1"):
        render_chat_template("{% if %}", [])
    with pytest.raises(TemplateError, match="failed"):
        render_chat_template("{{ messages[5].content.upper() }}", [])


def test_enable_thinking_reaches_the_template():
    from llama_spec.testing.synthetic_mtp import THINKING_TEMPLATE

    msgs = [{"role": "user", "content": "hi"}]
    assert render_chat_template(THINKING_TEMPLATE, msgs).endswith("<|im_start|>assistant\n<think>\n")
    assert render_chat_template(THINKING_TEMPLATE, msgs, enable_thinking=True).endswith("assistant\n<think>\n")
    off = render_chat_template(THINKING_TEMPLATE, msgs, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    with_tools = render_chat_template(THINKING_TEMPLATE, msgs, tools=tools)
    assert '{"type": "function", "function": {"name": "get_time", "parameters": {}}}' in with_tools


MALICIOUS = [
    # CVE-2024-34359's payload shape: reach os through a jinja2 global's function globals
    "{{ cycler.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "{{ joiner.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "{{ namespace.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "{{ lipsum.__globals__['os'].popen('touch CANARY').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c('touch CANARY', shell=True) }}{% endif %}{% endfor %}",
    "{{ ''['__class__'] }}",
    "{{ messages | attr('__class__') }}",
    "{{ self.__init__.__globals__ }}",
    "{{ cycler.__init__ }}",  # the stock sandbox would silently render this as ""
    "{{ messages.append({'role': 'x'}) }}",  # immutable sandbox: no mutation
    "{{ 'a' * 100000000000 }}",  # memory bomb
]


@pytest.mark.parametrize("payload", MALICIOUS)
def test_malicious_template_raises_and_runs_nothing(payload, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    canary = tmp_path / "CANARY"
    payload = payload.replace("CANARY", str(canary))
    with pytest.raises(TemplateError) as ei:
        render_chat_template(payload, [{"role": "user", "content": "hi"}])
    msg = str(ei.value)
    assert "\n" not in msg and ("unsafe" in msg or "limit" in msg), msg
    assert not canary.exists()
    assert not list(tmp_path.iterdir())


def test_malicious_template_in_chat_fails_before_generation(smollm, tmp_path):
    from llama_spec.chat_api import chat

    canary = tmp_path / "CANARY"
    bad = "{{ cycler.__init__.__globals__.os.popen('touch " + str(canary) + "').read() }}"
    with pytest.raises(TemplateError, match="unsafe"):
        chat(smollm, [{"role": "user", "content": "hi"}], chat_template=bad, max_tokens=4)
    with pytest.raises(TemplateError, match="unsafe"):
        chat(smollm, [{"role": "user", "content": "hi"}], chat_template=bad, max_tokens=4, stream=True)
    assert not canary.exists()


def test_chatml_fallback():
    out = render_chat_template(CHATML_TEMPLATE, [{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ============================================================================ thinking split (no model)


@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
        ("  <think>x</think>y", False, ("x", "y")),
        ("plan a\nplan b\n</think>\n\nthe answer\n", True, ("plan a\nplan b", "the answer\n")),
        ("still thinking ...", True, ("still thinking ...", "")),
        ("<think>\nnever closed\n", False, ("never closed", "")),
        ("no thinking here </think> at all", False, (None, "no thinking here </think> at all")),
        ("hello <think>", False, (None, "hello <think>")),
        ("\n</think>\n\nok", True, ("", "ok")),
    ],
)
def test_split_thinking(text, inside, expected):
    from llama_spec.chat_api import split_thinking

    assert split_thinking(text, inside) == expected


def test_split_thinking_incremental_equals_whole():
    import random

    from llama_spec.chat_api import ThinkSplitter, split_thinking

    rng = random.Random(0)
    texts = ["<think>\n a \n\n b </think>\n\n c \n", "x </thi", "  <thi", "<think></think>", "a\n</think>b</think>c"]
    for text in texts:
        for inside in (False, True):
            want = split_thinking(text, inside)
            for _ in range(100):
                sp, parts, i = ThinkSplitter(inside), [], 0
                while i < len(text):
                    j = i + rng.randint(1, 3)
                    parts += sp.feed(text[i:j])
                    i = j
                parts += sp.finish()
                got = ("".join(t for k, t in parts if k == "reasoning") if sp.saw_block else None,
                       "".join(t for k, t in parts if k == "content"))
                assert got == want, (text, inside)


def test_stop_hold_never_leaks_a_stop_string():
    from llama_spec.chat_api import StopHold

    h = StopHold(["STOP"])
    sent = "".join(h.feed(p) for p in ["ab", "cS", "TO", "P", "xyz"])
    assert sent == "abc"
    h = StopHold(["STOP"])
    sent = "".join(h.feed(p) for p in ["S", "T", "x"])
    assert sent == "STx"


# ============================================================================ rendering vs llama.cpp


def test_rendering_equals_llama_cpp_for_qwen25(qwen05):
    tmpl = qwen05.chat_template
    assert tmpl and "<|im_start|>" in tmpl
    for agp in (True, False):
        ours = render_chat_template(tmpl, CONVERSATION, add_generation_prompt=agp)
        theirs = qwen05.apply_builtin_chat_template(CONVERSATION, add_generation_prompt=agp)
        assert ours == theirs
    # Without a system message the jinja template adds Qwen's default system prompt; llama.cpp's
    # built-in (non-jinja) ChatML renderer does not know it: the rest is identical.
    ours = render_chat_template(tmpl, CONVERSATION[1:])
    default = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    assert ours == default + qwen05.apply_builtin_chat_template(CONVERSATION[1:])


def test_prepare_prompt_tokenizes_special_tokens(qwen05):
    from llama_spec.chat_api import prepare_prompt

    p = prepare_prompt(qwen05, CONVERSATION)
    im_start = qwen05.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1 and p.tokens.count(im_start[0]) == 7  # 6 turns + generation prompt
    assert qwen05.detokenize(p.tokens, unparse_special=True) == p.text
    assert not p.started_inside and not p.has_thinking


# ============================================================================ generation (real models)


HELLO = [{"role": "user", "content": "Write hello world in C"}]


@pytest.mark.slow
def test_cli_one_shot_hello_world_draft_simple(qwen15_path, qwen05_path, qwen15, qwen05):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-m", "llama_spec", "chat", "-m", "qwen2.5-coder-1.5b", "--spec-type", "draft-simple",
         "-md", "qwen2.5-coder-0.5b", "-p", "Write hello world in C", "--temp", "0", "-n", "128"],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "printf" in r.stdout and "main" in r.stdout, r.stdout
    assert "llama-spec:" not in r.stdout  # logs and stats go to stderr
    assert "draft-simple" in r.stderr and "accepted=" in r.stderr

    # The same request through the Python API: same greedy text, OpenAI-shaped result.
    from llama_spec import SamplerParams
    from llama_spec.chat_api import chat

    res = chat(qwen15, HELLO, drafter=qwen05, sampling=SamplerParams(temp=0.0), max_tokens=128)
    msg = res.choices[0].message
    assert "printf" in msg.content and "main" in msg.content
    assert msg.content.strip() == r.stdout.strip()
    assert msg.reasoning_content is None
    assert res.choices[0].finish_reason in ("stop", "length")
    assert res.usage.completion_tokens == len(res.generation.tokens) <= 128
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens
    assert res.speculative["drafted"] > 0 and res.speculative["accepted"] > 0
    d = json.loads(res.to_json())
    assert d["object"] == "chat.completion" and d["choices"][0]["message"]["role"] == "assistant"
    assert d["choices"][0]["message"]["content"] == msg.content
    assert set(d["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert d["speculative"]["drafted"] == res.speculative["drafted"]


@pytest.mark.slow
def test_stream_equals_non_stream_same_seed(qwen15, qwen05):
    from llama_spec import SamplerParams
    from llama_spec.chat_api import ChatCompletionChunk, chat

    kw = dict(drafter=qwen05, sampling=SamplerParams(temp=0.8), seed=42, max_tokens=64, stop=["return"])
    res = chat(qwen15, HELLO, **kw)
    chunks = list(chat(qwen15, HELLO, stream=True, **kw))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == res.choices[0].message.content
    assert "return" not in text  # the stop string never leaks, streamed or not
    last = chunks[-1]
    assert last.choices[0].finish_reason == res.choices[0].finish_reason
    assert last.usage == res.usage
    assert last.generation.tokens == res.generation.tokens
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.to_dict()["object"] == "chat.completion.chunk"


def _think_model():
    from llama_spec import Model
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    return Model(synthetic_mtp_path(sigma=0.0, seed=0, thinking=True), load_mtp=True)


@pytest.fixture(scope="module")
def think_model():
    m = _think_model()
    yield m
    m.close()


@pytest.mark.parametrize("drafter", [None, "mtp"])
def test_reasoning_budget_ends_think_block(think_model, drafter):
    """Random weights: the text is gibberish; the structure is what is checked."""
    from llama_spec import SamplerParams
    from llama_spec.chat_api import chat

    m = think_model
    think_end = m.tokenize("</think>", add_special=False, parse_special=True)
    assert len(think_end) == 1
    forced = m.tokenize("\n</think>\n\n", add_special=False, parse_special=True)
    res = chat(m, [{"role": "user", "content": "hi"}], reasoning_budget=8, drafter=drafter,
               sampling=SamplerParams(temp=0.8), seed=1, max_tokens=24)
    assert res.prompt.endswith("<|im_start|>assistant\n<think>\n")  # output starts inside the block
    toks = res.generation.tokens
    assert think_end[0] not in toks[:8]  # no natural end inside the budget (this seed)
    assert toks[8:8 + len(forced)] == forced  # then the forced end sequence, token by token
    msg = res.choices[0].message
    assert msg.reasoning_content == m.detokenize(toks[:8]).strip()
    assert msg.content == m.detokenize(toks[8 + len(forced):]).lstrip()
    assert "</think>" not in msg.content and "</think>" not in msg.reasoning_content
    assert res.usage.reasoning_tokens == 8 + forced.index(think_end[0])
    assert res.choices[0].finish_reason == "length"

    # streaming gives the same split
    chunks = list(chat(m, [{"role": "user", "content": "hi"}], reasoning_budget=8, drafter=drafter,
                       sampling=SamplerParams(temp=0.8), seed=1, max_tokens=24, stream=True))
    assert "".join(c.choices[0].delta.reasoning_content or "" for c in chunks) == msg.reasoning_content
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content


def test_reasoning_budget_states_follow_the_prompt(think_model):
    from llama_spec.chat_api import make_budget, prepare_prompt

    m = think_model
    msgs = [{"role": "user", "content": "hi"}]
    on = prepare_prompt(m, msgs)
    assert on.started_inside and on.tags == ("<think>", "</think>") and on.has_thinking
    assert make_budget(m, on, 8, "").state == "counting"
    off = prepare_prompt(m, msgs, enable_thinking=False)
    assert not off.started_inside
    assert make_budget(m, off, 8, "").state == "idle"
    assert make_budget(m, on, None, "") is None and make_budget(m, on, -1, "") is None


def test_no_thinking_gives_no_reasoning(think_model):
    from llama_spec import SamplerParams
    from llama_spec.chat_api import chat

    res = chat(think_model, [{"role": "user", "content": "hi"}], enable_thinking=False, reasoning_budget=4,
               sampling=SamplerParams(temp=0.0), max_tokens=8)
    assert res.prompt.endswith("<think>\n\n</think>\n\n")
    assert res.choices[0].message.reasoning_content is None
    assert res.usage.reasoning_tokens == 0


def test_stop_string_and_max_tokens(smollm):
    from llama_spec import SamplerParams
    from llama_spec.chat_api import chat

    msgs = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    full = chat(smollm, msgs, sampling=SamplerParams(temp=0.0), max_tokens=16)
    assert full.choices[0].finish_reason in ("length", "stop")
    text = full.choices[0].message.content
    assert len(text) > 4
    stop = text[2:4]
    cut = chat(smollm, msgs, sampling=SamplerParams(temp=0.0), max_tokens=16, stop=[stop])
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    one = chat(smollm, msgs, sampling=SamplerParams(temp=0.0), max_tokens=1)
    assert one.usage.completion_tokens == 1 and one.choices[0].finish_reason == "length"


def test_llama_spec_chat_is_callable(smollm):
    import importlib

    import llama_spec

    chat_module = importlib.import_module("llama_spec.chat_api")
    assert llama_spec.chat is chat_module.chat  # the package attribute is the function
    from llama_spec import SamplerParams

    r = llama_spec.chat(smollm, [{"role": "user", "content": "hi"}], sampling=SamplerParams(temp=0.0), max_tokens=2)
    assert r.usage.completion_tokens <= 2


def test_cli_repl_keeps_history(monkeypatch, capsys):
    import importlib

    from llama_spec import cli

    chat_module = importlib.import_module("llama_spec.cli.chat")  # the REPL lives in the CLI
    seen = []
    real_turn = chat_module._turn

    def spy(gen, messages, *a, **k):
        seen.append([dict(m) for m in messages])
        return real_turn(gen, messages, *a, **k)

    monkeypatch.setattr(chat_module, "_turn", spy)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n\nsecond \\\nline\n/exit\nnever read\n"))
    rc = cli.main(["chat", "-m", "smollm2-135m", "-sys", "Be brief.", "-n", "4", "--temp", "0", "-c", "512"])
    assert rc == 0
    assert [len(s) for s in seen] == [2, 4]
    assert seen[1][0] == {"role": "system", "content": "Be brief."}
    assert seen[1][2]["role"] == "assistant"
    assert seen[1][3] == {"role": "user", "content": "second \nline"}
    out = capsys.readouterr()
    assert out.out.endswith("\n") and "llama-spec:" not in out.out
    assert out.err.count("llama-spec: stop=") == 2


# ============================================================================ Hugging Face hub (offline)


REV = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """huggingface_hub's cache layout: blobs/, snapshots/<rev>/<file> -> blob, refs/main."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(REV)
    (folder / "blobs").mkdir()
    for name, src in files.items():
        blob = folder / "blobs" / (name.replace("/", "_") + ".blob")
        blob.symlink_to(src)
        dst = folder / "snapshots" / REV / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(os.path.relpath(blob, dst.parent))
    return folder


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, smollm_path):
    cache = tmp_path / "hub"
    _fake_hub(cache, "someone/SmolLM2-135M-Instruct-GGUF", {
        "SmolLM2-135M-Instruct.Q4_1.gguf": smollm_path,
        "README.md": smollm_path,
    })
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hf_offline_cached_model_loads(offline_hub):
    from llama_spec import Model
    from llama_spec.models.hub import resolve_hf

    p = resolve_hf("someone/SmolLM2-135M-Instruct-GGUF:q4_1")
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.is_file()
    assert str(p).startswith(str(offline_hub))
    assert resolve_hf("someone/SmolLM2-135M-Instruct-GGUF") == p  # no Q4_K_M: the first GGUF
    m = Model.from_pretrained("someone/SmolLM2-135M-Instruct-GGUF", "*q4_1.gguf", vocab_only=True)
    try:
        assert m.n_vocab == 49152 and m.path == p
    finally:
        m.close()


def test_cli_chat_hf_from_offline_cache(offline_hub, capsys):
    from llama_spec import cli

    rc = cli.main(["chat", "-m", "unused", "-hf", "someone/SmolLM2-135M-Instruct-GGUF:Q4_1", "-p", "hi",
                   "-n", "3", "--temp", "0", "-c", "256"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert str(offline_hub) in out.err and "generated=" in out.err


def test_hf_offline_uncached_is_a_one_line_error(offline_hub, capsys):
    from llama_spec import Model, cli
    from llama_spec.models.hub import ModelNotCachedError, resolve_hf

    with pytest.raises(ModelNotCachedError) as ei:
        resolve_hf("nobody/Missing-GGUF:Q4_K_M")
    msg = str(ei.value)
    assert msg == f"HF_HUB_OFFLINE=1 and nobody/Missing-GGUF/*Q4_K_M*.gguf is not in the cache ({offline_hub})"
    with pytest.raises(ModelNotCachedError, match=r"someone/SmolLM2-135M-Instruct-GGUF/\*q8_0\.gguf is not in"):
        Model.from_pretrained("someone/SmolLM2-135M-Instruct-GGUF", "*q8_0.gguf")

    rc = cli.main(["chat", "-m", "unused", "-hf", "nobody/Missing-GGUF:Q4_K_M", "-p", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"error: {msg}"]


def test_select_gguf_rules():
    from llama_spec.models.hub import HubError, parse_hf_spec, select_gguf

    files = ["README.md", "model-Q4_K_M.gguf", "model-Q4_K_S.gguf", "model-Q8_0.gguf", "mmproj-model-f16.gguf",
             "big/model-Q6_K-00002-of-00002.gguf", "big/model-Q6_K-00001-of-00002.gguf"]
    assert select_gguf(files, None) == ["model-Q4_K_M.gguf"]
    assert select_gguf(files, "q8_0") == ["model-Q8_0.gguf"]
    assert select_gguf(files, "Q4_K_M") == ["model-Q4_K_M.gguf"]
    assert select_gguf(files, "*q4_k_s.gguf") == ["model-Q4_K_S.gguf"]
    assert select_gguf(files, "Q6_K") == ["big/model-Q6_K-00001-of-00002.gguf", "big/model-Q6_K-00002-of-00002.gguf"]
    assert select_gguf(["b.gguf", "a.gguf", "mmproj-x.gguf"], None) == ["a.gguf"]
    with pytest.raises(HubError, match="several models"):
        select_gguf(files, "*Q4_K_*.gguf")
    with pytest.raises(HubError, match="no GGUF file matches"):
        select_gguf(files, "Q2_K")
    assert parse_hf_spec("hf.co/owner/name:Q4_K_M") == ("owner/name", "Q4_K_M")
    assert parse_hf_spec("owner/name") == ("owner/name", None)
    with pytest.raises(HubError):
        parse_hf_spec("just-a-name")


def test_tool_calls_are_parsed_into_openai_shape():
    from llama_spec.chat_api import parse_tool_calls

    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert len(calls) == 1 and calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
