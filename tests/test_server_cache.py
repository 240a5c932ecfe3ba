"""The prompt cache through the server (issue 24): cached_tokens in usage, the RAM bound, and
clients that share a system prompt or go away mid-stream while others reuse cells."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from conftest import same_or_near_tie  # noqa: E402
from test_server import API_KEY, N_CTX, THREADS, _Server, _stream_some  # noqa: E402

SYSTEM = "You review Python code. Be brief. " * 12
EXACT = {"flash_attn": "off"}   # with repack off: prompt splits round alike (tests/test_prompt_cache.py)
NEAR_TIE = 1.0   # logits: 1-row and batched decodes of the same tokens differ by up to 0.68 here
                 # (scripts/batch_shape_rounding.py, SmolLM2 Q4_1, AMD EPYC, 2026-12-04)


def _engine(model, n_parallel: int, cache_ram: float):
    from llama_spec.drafters.draft_model import DraftModelDrafter
    from llama_spec.generation.batch import BatchGenerator
    from llama_spec.server import ServerEngine

    def make_batch():
        return BatchGenerator(model, lambda: DraftModelDrafter(model, n_ctx=N_CTX, n_threads=THREADS, flash_attn="off"),
                              n_parallel=n_parallel, n_ctx=N_CTX, n_threads=THREADS, n_max=3, cache_ram=cache_ram,
                              context_options=EXACT)

    return ServerEngine(make_batch, max_queue=64)


@pytest.fixture(scope="module")
def solo(smollm):
    """The reference: the same pair alone, every prompt decoded whole."""
    from llama_spec import SamplerParams, SpeculativeGenerator
    from llama_spec.drafters.draft_model import DraftModelDrafter

    gen = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS, flash_attn="off"),
                               n_ctx=N_CTX, n_threads=THREADS, n_max=3, context_options=EXACT)

    def run(prompt, n: int):
        return gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=n, cache_prompt=False)

    yield run
    gen.close()


@pytest.fixture(scope="module")
def cached_server(smollm):
    s = _Server(smollm, api_key=API_KEY, engine=_engine(smollm, 2, 16))
    yield s
    s.stop()


def test_chat_turns_report_cached_tokens(cached_server):
    c = cached_server.client()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does len([]) return?"}]
    r1 = c.chat.completions.create(model="smollm", messages=msgs, max_tokens=8, temperature=0)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And len('ab')?"}]
    r2 = c.chat.completions.create(model="smollm", messages=msgs, max_tokens=8, temperature=0)
    n2 = r2.usage.prompt_tokens_details.cached_tokens
    assert r1.usage.prompt_tokens - 3 <= n2 < r2.usage.prompt_tokens
    # streaming: the usage chunk carries it too
    msgs += [{"role": "assistant", "content": r2.choices[0].message.content},
             {"role": "user", "content": "Thanks."}]
    chunks = list(c.chat.completions.create(model="smollm", messages=msgs, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and r2.usage.prompt_tokens - 3 <= usage.prompt_tokens_details.cached_tokens
    # cache_prompt false (llama-server's field): the whole prompt is decoded
    r4 = c.completions.create(model="smollm", prompt=SYSTEM + "x = 1", max_tokens=2, temperature=0)
    r5 = c.completions.create(model="smollm", prompt=SYSTEM + "x = 1", max_tokens=2, temperature=0,
                              extra_body={"cache_prompt": False})
    assert r4.choices[0].text == r5.choices[0].text
    assert r5.usage.prompt_tokens_details.cached_tokens == 0
    bad = httpx.post(cached_server.url + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                     json={"prompt": "x", "max_tokens": 1, "cache_prompt": "yes"}, timeout=10)
    assert bad.status_code == 400 and "cache_prompt" in bad.text


def test_ram_cache_stays_inside_its_limit(cached_server):
    """Distinct conversations (about 7 MiB of state each) through a 16 MiB cache: the cache's own
    count never passes the limit, and it evicts. (scripts/bench_cache_memory.py: 200 x 256 MiB, RSS.)"""
    c = cached_server.client()
    for i in range(14):
        c.completions.create(model="smollm", prompt=f"Conversation {i}: " + SYSTEM + f"item {i}", max_tokens=2,
                             temperature=0)
        info = cached_server.health()["prompt_cache"]
        assert info["limit_bytes"] == 16 * 2**20
        assert 0 <= info["size_bytes"] <= info["limit_bytes"]
    assert info["evictions"] > 0 and info["entries"] >= 1


def test_clients_sharing_a_prompt_with_disconnects_lose_nothing(smollm, solo):
    """12 clients over 4 slots, one system prompt; 4 go away mid-stream. Every finished answer
    equals its solo run with the whole prompt decoded (greedy, flash attention off: bitwise on
    the CPUs seen here), or leaves it only at a near-tie of the reference (conftest.same_or_near_tie), so
    no one got another's cells (those change an answer's digits, far from any tie)."""
    s = _Server(smollm, api_key=API_KEY, engine=_engine(smollm, 4, 32))
    try:
        c = s.client()
        prompts = [SYSTEM + f"Question {i}: what is {i} + {i}?" for i in range(12)]
        gone = {1, 4, 7, 10}

        def client(i: int):
            if i in gone:
                return _stream_some(s.url, 2, 40)
            return c.completions.create(model="smollm", prompt=prompts[i], max_tokens=10, temperature=0)

        with ThreadPoolExecutor(12) as ex:
            out = list(ex.map(client, range(12)))
        s.wait_idle(30)
        for i, r in enumerate(out):
            if i not in gone:
                ref = solo(prompts[i], 10)
                assert same_or_near_tie(smollm, ref, r.choices[0].text, NEAR_TIE, **EXACT), (i, ref.text, r.choices[0].text)
        cached = [r.usage.prompt_tokens_details.cached_tokens for i, r in enumerate(out) if i not in gone]
        assert sum(n > 0 for n in cached) >= 4   # the system prompt was reused
    finally:
        s.stop()
