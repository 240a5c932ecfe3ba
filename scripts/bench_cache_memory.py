"""The prompt cache under load through ``llama-spec serve`` (issue 24, "What it must show" 3).

1. --conversations N (default 200) distinct conversations, one after another, each 2 turns,
   against a server with ``--cache-ram MiB`` (default 256): after every request the cache's own
   count (``GET /health`` -> prompt_cache.size_bytes) must be <= the limit, and the server's RSS
   (``/proc/PID/status`` VmRSS) may grow by less than --max-rss-growth MiB (default 300) from
   the first conversation's end to the last one's.
2. --clients C (default 32) concurrent streaming clients sharing a system prompt, --disconnect D
   (default 10) of them dropping the connection after a few chunks: every completed answer must
   equal its reference (the same prompt sent alone to a fresh server with ``cache_prompt: false``;
   greedy; flash attention and repacking off, where every batch shape rounds alike), so none was
   lost or crossed.

    python scripts/bench_cache_memory.py -m smollm2-135m --conversations 200 --cache-ram 256
    python scripts/bench_cache_memory.py --quick      # 30 conversations, 8 clients / 3 disconnecting

Exit status 1 when a check fails. The suite's small version: tests/test_server_cache.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_chat_turns import Server, free_port  # noqa: E402
from bench_spec import loadavg, machine_info  # noqa: E402

SYSTEM = "You are reviewing a pull request. Comment on style, bugs and tests. " * 10


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(a: argparse.Namespace, cache_ram: float, parallel: int) -> Server:
    cmd = [sys.executable, "-m", "llama_spec", "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx),
           "-np", str(parallel), "--cache-ram", str(cache_ram), "-fa", "off", "-nr", "--port", str(free_port())]
    s = Server("ours", cmd, int(cmd[-1]))
    s.wait_up(300)
    return s


def conversations(a: argparse.Namespace) -> dict:
    import httpx
    import openai

    s = start(a, a.cache_ram, 1)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)
        sizes, rss0, worst = [], None, 0
        t0 = time.monotonic()
        for i in range(a.conversations):
            msgs = [{"role": "system", "content": f"Conversation {i}. " + SYSTEM},
                    {"role": "user", "content": f"Review change number {i}."}]
            for turn in range(2):
                r = c.chat.completions.create(model="x", messages=msgs, max_tokens=a.max_tokens, temperature=0)
                msgs += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": f"And the tests of change {i}, turn {turn}?"}]
                info = httpx.get(s.url + "/health", timeout=10).json()["prompt_cache"]
                sizes.append(info["size_bytes"])
                worst = max(worst, info["size_bytes"])
                if info["size_bytes"] > info["limit_bytes"]:
                    print(f"conversation {i}: cache {info['size_bytes']} > limit {info['limit_bytes']}", file=sys.stderr)
            if i == 0:
                rss0 = rss_mib(s.p.pid)
            if (i + 1) % 20 == 0:
                print(f"  {i + 1}/{a.conversations} conversations, cache {info['size_bytes'] / 2**20:.1f} MiB "
                      f"({info['entries']} entries, {info['evictions']} evicted), RSS {rss_mib(s.p.pid):.0f} MiB",
                      file=sys.stderr, flush=True)
        rss1 = rss_mib(s.p.pid)
        return {"conversations": a.conversations, "limit_mib": a.cache_ram, "max_cache_mib": worst / 2**20,
                "final_cache": info, "rss_first_mib": rss0, "rss_last_mib": rss1,
                "rss_growth_mib": rss1 - (rss0 or rss1), "seconds": time.monotonic() - t0,
                "ok": worst <= a.cache_ram * 2**20 and rss1 - (rss0 or rss1) < a.max_rss_growth}
    finally:
        s.stop()


def _complete(url: str, prompt: str, n: int, cache: bool = True) -> tuple[str, int]:
    import httpx

    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "cache_prompt": cache}, timeout=600)
    r.raise_for_status()
    js = r.json()
    return js["choices"][0]["text"], js["usage"]["prompt_tokens_details"]["cached_tokens"]


def _drop_after(url: str, prompt: str, n_chunks: int) -> int:
    import httpx

    got = 0
    with httpx.stream("POST", url + "/v1/completions", timeout=600,
                      json={"prompt": prompt, "max_tokens": 64, "stream": True, "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
                if got >= n_chunks:
                    break
    return got


def clients(a: argparse.Namespace) -> dict:
    prompts = [SYSTEM + f"Client {i}: summarise change {i} in one line." for i in range(a.clients)]
    gone = set(range(1, a.clients, max(1, a.clients // max(1, a.disconnect))))
    gone = set(sorted(gone)[: a.disconnect])
    s = start(a, a.cache_ram, a.parallel)
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(a.clients) as ex:
            futs = [ex.submit(_drop_after, s.url, p, 2) if i in gone else ex.submit(_complete, s.url, p, a.max_tokens)
                    for i, p in enumerate(prompts)]
            out = [f.result() for f in futs]
        wall = time.monotonic() - t0
    finally:
        s.stop()
    ref = start(a, 0, 1)
    try:
        want = {i: _complete(ref.url, p, a.max_tokens, cache=False)[0] for i, p in enumerate(prompts) if i not in gone}
    finally:
        ref.stop()
    wrong = [i for i in want if out[i][0] != want[i]]
    cached = [out[i][1] for i in want]
    return {"clients": a.clients, "disconnected": sorted(gone), "wrong": wrong, "wall_s": wall,
            "cached_tokens": cached, "ok": not wrong}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--cache-ram", type=float, default=256)
    ap.add_argument("--max-rss-growth", type=float, default=300)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--disconnect", type=int, default=10)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.conversations, a.clients, a.disconnect, a.cache_ram = 30, 8, 3, 32
    res = {"machine": machine_info(), "load_before": loadavg()}
    res["conversations"] = conversations(a)
    print(json.dumps(res["conversations"], indent=1))
    res["clients"] = clients(a)
    print(json.dumps(res["clients"], indent=1))
    res["load_after"] = loadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if res["conversations"]["ok"] and res["clients"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
