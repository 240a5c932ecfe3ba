#!/usr/bin/env python
"""Multi-turn chat latency: ``llama-spec serve`` against native ``llama-server`` (issue 24).

The protocol of issue 24's "Why" table, through the official ``openai`` client: a chat of
--turns turns (default 6), streaming, temperature 0, --max-tokens 32 answers, one system prompt
of code under review (~1,450 tokens of Qwen2.5-Coder: turn 1 is ~1,480 prompt tokens with the
template and the first question) and a short review question per turn; each turn sends every
earlier turn again, the assistant answers as the server returned them. Both servers get the same
GGUF, ``-t``, ``--parallel`` and per-slot context, run one after the other, each fresh on a free
port (``--rounds 2``: ours, native, native, ours).

Per turn: prompt tokens (``usage.prompt_tokens``), TTFT (request sent -> first chunk with text),
total time, completion tokens, and the cached prompt tokens the server reports
(``usage.prompt_tokens_details.cached_tokens``; native ``llama-server`` also gives
``timings.cache_n``; "-" = not reported). Summary, the goals of issue 24: turns >= 2 TTFT
ours / native (goal <= 1.2x), ours turns >= 2 / ours turn 1 (goal <= 0.05x), total time.

``--clients 4`` (or ``--clients 1,4``: both): 4 concurrent conversations sharing the system
prompt (different questions) against servers with ``--parallel 4``. Reported: each client's
turn-1 TTFT, and the prompt tokens each server decoded (prompt_tokens - cached) at turn 1 and in
all, against the ideal (the shared prefix once + each client's own part): whether the shared
system prompt was prefilled once.

The system prompt is cut from this repository's ``llama_spec/kernels/token.py`` as of a pinned
commit (``git show``; the working-tree file, with a warning, where git has no such commit), so
the prompt is the same across sessions; its token count with the model in use is printed.

Native ``llama-server`` is ``--native-server PATH``, else built once from the pinned llama.cpp
source (``bench_server.build_native_server``: the package's own build configures
LLAMA_BUILD_SERVER=OFF, so it goes to its own cmake folder with the package's cmake line,
AMX off; niced, cached).

    python scripts/bench_chat_turns.py --quick                    # smoke: smollm2-135m, 3 turns (~1 min)
    python scripts/bench_chat_turns.py                            # issue 24's table (minutes)
    python scripts/bench_chat_turns.py --clients 4 --json out.json
    python scripts/bench_chat_turns.py --rounds 2 --clients 1,4
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_spec import loadavg, machine_info, write_json  # noqa: E402

# The code under review: a pinned blob, so every session reviews the same text.
SOURCE_COMMIT = "0e3c62e5fe4becaddc896e9f5553f90a6c7a0da1"
SOURCE_PATH = "llama_spec/kernels/token.py"
SYSTEM_HEAD = ("You are a senior Python reviewer. The module below is under review; answer each question "
               "about it briefly and concretely.\n\n```python\n")
SYSTEM_TAIL = "```\n"

# 4 clients x 6 turns of short review questions; client k asks QUESTIONS[6k:6k+6] (client 0 = --clients 1)
QUESTIONS = [
    "What does new_rng_state do with a seed of 0?",
    "Is _next_uniform's output really uniform in [0, 1)?",
    "Can _draw return -1, and when?",
    "Why are the helpers register_jitable instead of njit?",
    "Is the per-thread scratch buffer safe with many threads?",
    "Name one edge case the tests should cover.",
    "What is AcceptResult used for?",
    "Why mask with _M64 in new_rng_state?",
    "How many uniforms does one accepted draft consume?",
    "What happens if p_probs has a NaN?",
    "Would you rename any function here?",
    "Summarize the module in one sentence.",
    "Why does _rotl take uint64 arguments?",
    "Is _N_CHECKPOINTS a good name?",
    "Which function is the hot path?",
    "How would you test _draw_residual_by_rejection?",
    "Any dead code in this module?",
    "What would you document better?",
    "Does __all__ list everything public?",
    "Why import numba.extending separately?",
    "What does _inner mean here?",
    "Could the RNG state ever be all zeros?",
    "Is float64 precision enough for the CDF?",
    "Give the riskiest line and why.",
]




def questions(client: int, turns: int) -> list[str]:
    """Client k's questions: QUESTIONS[6k:6k+turns], wrapping (clients 0-3 ask distinct ones for <= 6 turns)."""
    return [QUESTIONS[(6 * client + j) % len(QUESTIONS)] for j in range(turns)]


# --------------------------------------------------------------------------------------------- prompt


def source_text() -> tuple[str, str]:
    """(code of SOURCE_PATH at SOURCE_COMMIT without its module docstring, where it came from)."""
    try:
        text = subprocess.run(["git", "show", f"{SOURCE_COMMIT}:{SOURCE_PATH}"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30, check=True).stdout
        origin = f"{SOURCE_PATH}@{SOURCE_COMMIT[:9]}"
    except (OSError, subprocess.SubprocessError):
        text = (ROOT / SOURCE_PATH).read_text()
        origin = f"{SOURCE_PATH} (working tree: commit {SOURCE_COMMIT[:9]} not in git here)"
        print(f"WARNING: system prompt from the working-tree {SOURCE_PATH}: not comparable with pinned runs",
              file=sys.stderr)
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        text = "\n".join(text.splitlines()[body[0].end_lineno:]).lstrip("\n")
    return text, origin


def build_system_prompt(count, target_tokens: int) -> tuple[str, int, str]:
    """The longest whole-line cut of the code whose system text has <= target_tokens tokens
    (count: str -> int): (text, tokens, origin)."""
    code, origin = source_text()
    lines = code.splitlines(keepends=True)

    def text(n: int) -> str:
        return SYSTEM_HEAD + "".join(lines[:n]) + SYSTEM_TAIL

    lo, hi = 0, len(lines)
    if count(text(hi)) <= target_tokens:
        lo = hi
    while lo < hi:  # largest n with count(text(n)) <= target
        mid = (lo + hi + 1) // 2
        if count(text(mid)) <= target_tokens:
            lo = mid
        else:
            hi = mid - 1
    t = text(lo)
    return t, count(t), origin


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --------------------------------------------------------------------------------------------- servers


class Server:
    """One server process: started fresh, health-checked, always stopped (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        self.name, self.cmd, self.port = name, cmd, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.log_tail: list[str] = []
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                  cwd=ROOT, preexec_fn=_die_with_parent)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.p.stderr is not None
        fh = open(self.log_path, "a") if self.log_path else None  # noqa: SIM115 - closed below
        try:
            for ln in self.p.stderr:
                self.log_tail = [*self.log_tail[-39:], ln]
                if fh:
                    fh.write(ln)
        finally:
            if fh:
                fh.close()

    def wait_up(self, timeout: float) -> str:
        """Wait for /health (200), then return the first model id of /v1/models."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.p.returncode}:\n{''.join(self.log_tail[-20:])}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    js = httpx.get(self.url + "/v1/models", timeout=10).json()
                    return str(js["data"][0]["id"])
            except (httpx.TransportError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not come up in {timeout:.0f} s:\n{''.join(self.log_tail[-20:])}")

    def stop(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                print(f"{self.name} ignored SIGTERM for 30 s: killing it", file=sys.stderr)
                self.p.kill()
                self.p.wait(30)


def _die_with_parent() -> None:
    """In the child: SIGTERM when this benchmark dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ours_cmd(a: argparse.Namespace, model: Path, parallel: int, port: int) -> list[str]:
    # -c here is the context of ONE slot (llama-spec serve --help)
    cmd = [sys.executable, "-m", "llama_spec", "serve", "-m", str(model), "--parallel", str(parallel),
           "-c", str(a.ctx), "-t", str(a.threads), "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["-nr"] if a.no_repack else [])


def native_cmd(a: argparse.Namespace, binary: Path, model: Path, parallel: int, port: int) -> list[str]:
    # llama-server divides -c among its slots: parallel x the per-slot context ours gets
    cmd = [str(binary), "-m", str(model), "--parallel", str(parallel), "-c", str(a.ctx * parallel),
           "-t", str(a.threads), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    return cmd + (["-nr"] if a.no_repack else [])


def native_binary(a: argparse.Namespace) -> Path | None:
    if a.skip_native:
        return None
    if a.native_server:
        return Path(a.native_server)
    from bench_server import build_native_server

    t0 = time.perf_counter()
    b = build_native_server()  # cached: instant once built
    dt = time.perf_counter() - t0
    if dt > 5:
        print(f"built native llama-server in {dt:.0f} s: {b}", file=sys.stderr)
    return b


# --------------------------------------------------------------------------------------------- one turn


def _extra(obj: Any) -> dict:
    """Fields the openai models do not declare (llama-server's `timings`, ours' `speculative`)."""
    return dict(getattr(obj, "model_extra", None) or {})


def one_turn(client: Any, model_id: str, messages: list[dict], a: argparse.Namespace) -> dict:
    """Stream one chat completion; return its figures and the answer text."""
    t0 = time.perf_counter()
    ttft = None
    parts: list[str] = []
    usage: Any = None
    timings: dict | None = None
    n_chunks = 0
    stream = client.chat.completions.create(
        model=model_id, messages=messages, stream=True, temperature=0.0, max_tokens=a.max_tokens, seed=1,
        stream_options={"include_usage": True})
    try:
        for ch in stream:
            n_chunks += 1
            for c in ch.choices or []:
                d = c.delta
                text = (getattr(d, "content", None) or "") + (_extra(d).get("reasoning_content") or "")
                if text:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(getattr(d, "content", None) or "")
            if ch.usage is not None:
                usage = ch.usage
            t = _extra(ch).get("timings")
            if isinstance(t, dict):
                timings = t
    finally:
        stream.close()
    total = time.perf_counter() - t0
    rec: dict[str, Any] = {"ttft_s": ttft, "total_s": total, "chunks": n_chunks, "prompt_tokens": None,
                           "completion_tokens": None, "cached_tokens": None, "cache_n": None}
    if usage is not None:
        rec["prompt_tokens"] = usage.prompt_tokens
        rec["completion_tokens"] = usage.completion_tokens
        det = getattr(usage, "prompt_tokens_details", None)
        if det is not None and getattr(det, "cached_tokens", None) is not None:
            rec["cached_tokens"] = int(det.cached_tokens)
    if timings:
        rec["timings"] = timings
        if timings.get("cache_n") is not None:
            rec["cache_n"] = int(timings["cache_n"])
        if rec["prompt_tokens"] is None and timings.get("prompt_n") is not None:
            rec["prompt_tokens"] = int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
    rec["cached"] = rec["cached_tokens"] if rec["cached_tokens"] is not None else rec["cache_n"]
    if ttft is not None and rec["completion_tokens"] and rec["completion_tokens"] > 1 and total > ttft:
        rec["decode_tps"] = (rec["completion_tokens"] - 1) / (total - ttft)
    rec["answer"] = "".join(parts)
    return rec


def conversation(url: str, model_id: str, system: str, questions: list[str], a: argparse.Namespace,
                 start: threading.Barrier | None = None) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=a.timeout, max_retries=0)
    messages: list[dict] = [{"role": "system", "content": system}]
    turns = []
    if start is not None:
        start.wait()
    for i, q in enumerate(questions):
        messages.append({"role": "user", "content": q})
        rec = one_turn(client, model_id, messages, a)
        rec.update(turn=i + 1, question=q)
        messages.append({"role": "assistant", "content": rec["answer"]})
        turns.append(rec)
    return turns


def warm_up(url: str, a: argparse.Namespace) -> None:
    """Page the weights in with a plain completion that shares no prefix with the chat."""
    import httpx

    r = httpx.post(url + "/v1/completions", json={"prompt": "Warm-up: count to three.", "max_tokens": 4,
                                                    "temperature": 0.0}, timeout=a.timeout)
    r.raise_for_status()


# --------------------------------------------------------------------------------------------- runs


def run_server(name: str, cmd: list[str], port: int, a: argparse.Namespace, system: str, n_clients: int,
               env: dict[str, str] | None = None) -> dict:
    srv = Server(name, cmd, port, env=env, log_path=Path(a.log_dir) / f"{name}-{port}.log" if a.log_dir else None)
    try:
        model_id = srv.wait_up(a.startup_timeout)
        warm_up(srv.url, a)
        t0 = time.perf_counter()
        if n_clients == 1:
            clients = [conversation(srv.url, model_id, system, questions(0, a.turns), a)]
        else:
            barrier = threading.Barrier(n_clients)
            ex = ThreadPoolExecutor(n_clients)
            try:
                futs = [ex.submit(conversation, srv.url, model_id, system, questions(k, a.turns), a, barrier)
                        for k in range(n_clients)]
                clients = [f.result() for f in futs]
            finally:
                ex.shutdown(wait=False, cancel_futures=True)
        wall = time.perf_counter() - t0
    finally:
        srv.stop()
    return {"server": name, "clients": n_clients, "command": cmd, "wall_s": wall, "conversations": clients,
            "load": loadavg()}


# --------------------------------------------------------------------------------------------- report


def _f(x: float | None, fmt: str = ".2f", unit: str = " s") -> str:
    return "-" if x is None else f"{x:{fmt}}{unit}"


def _n(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _med(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def turn_table(run: dict) -> str:
    conv = run["conversations"][0]
    rows = ["| turn | prompt tokens | TTFT | total | cached_tokens | cache_n | decode t/s |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for t in conv:
        rows.append(f"| {t['turn']} | {_n(t['prompt_tokens'])} | {_f(t['ttft_s'])} | {_f(t['total_s'])} | "
                    f"{_n(t['cached_tokens'])} | {_n(t['cache_n'])} | {_f(t.get('decode_tps'), '.1f', '')} |")
    rows.append(f"| all {len(conv)} | | {_f(sum(t['ttft_s'] or 0 for t in conv))} | "
                f"{_f(sum(t['total_s'] for t in conv))} | | | |")
    return "\n".join(rows)


def single_summary(runs: list[dict]) -> dict:
    """Per server: median over rounds of each turn's TTFT; the issue's ratios."""
    per: dict[str, dict] = {}
    for name in ("ours", "native"):
        rs = [r for r in runs if r["server"] == name and r["clients"] == 1]
        if not rs:
            continue
        n_turns = len(rs[0]["conversations"][0])
        ttft = [_med([r["conversations"][0][i]["ttft_s"] for r in rs]) for i in range(n_turns)]
        total = _med([sum(t["total_s"] for t in r["conversations"][0]) for r in rs])
        later = _med(ttft[1:]) if n_turns > 1 else None
        per[name] = {"ttft_turn": ttft, "ttft_turn1": ttft[0], "ttft_later_median": later, "total_s": total,
                     "later_over_turn1": later / ttft[0] if later is not None and ttft[0] else None,
                     "cached_reported": any(t["cached"] is not None for r in rs for t in r["conversations"][0])}
    out: dict[str, Any] = {"per_server": per}
    if "ours" in per and "native" in per:
        o, n = per["ours"], per["native"]
        if o["ttft_later_median"] is not None and n["ttft_later_median"]:
            out["later_ttft_ours_over_native"] = o["ttft_later_median"] / n["ttft_later_median"]
        out["total_ours_over_native"] = o["total_s"] / n["total_s"] if n["total_s"] else None
        out["ttft_turn1_ours_over_native"] = o["ttft_turn1"] / n["ttft_turn1"] if n["ttft_turn1"] else None
    return out


def print_single_summary(s: dict) -> None:
    per = s["per_server"]
    print("\nsummary (median over rounds; turns >= 2 = median of those turns' TTFT)")
    for name, v in per.items():
        print(f"  {name:6}: turn 1 TTFT {_f(v['ttft_turn1'])}, turns >= 2 TTFT {_f(v['ttft_later_median'])} "
              f"(= {_f(v['later_over_turn1'], '.3f', 'x')} turn 1), total {_f(v['total_s'], '.1f')}"
              + ("" if v["cached_reported"] else ", cached_tokens not reported"))
    if "later_ttft_ours_over_native" in s:
        print(f"  turns >= 2 TTFT ours / native: {s['later_ttft_ours_over_native']:.2f}x (goal <= 1.2x)")
    if "ours" in per and per["ours"]["later_over_turn1"] is not None:
        print(f"  ours turns >= 2 / ours turn 1: {per['ours']['later_over_turn1']:.3f}x (goal <= 0.05x)")
    if s.get("total_ours_over_native"):
        print(f"  total time ours / native: {s['total_ours_over_native']:.2f}x; "
              f"turn 1 TTFT ours / native: {s['ttft_turn1_ours_over_native']:.2f}x")


def multi_report(run: dict, shared: int | None) -> dict:
    """Per client: turn-1 TTFT and decoded prompt tokens; totals against the prefilled-once ideal."""
    convs = run["conversations"]
    rows, dec1, ideal1, dec_all, prompt1 = [], 0, 0, 0, 0
    unknown = False
    for k, conv in enumerate(convs):
        t1 = conv[0]
        p1 = t1["prompt_tokens"] or 0
        c1 = t1["cached"]
        unknown |= c1 is None
        d1 = p1 - (c1 or 0)
        dec1 += d1
        prompt1 += p1
        ideal1 += p1 - (shared or 0) if k else p1
        d_all = sum((t["prompt_tokens"] or 0) - (t["cached"] or 0) for t in conv)
        unknown |= any(t["cached"] is None for t in conv)
        dec_all += d_all
        rows.append({"client": k, "ttft_turn1_s": t1["ttft_s"], "prompt_tokens_turn1": p1, "cached_turn1": c1,
                     "decoded_turn1": d1, "decoded_all": d_all,
                     "prompt_tokens_all": sum(t["prompt_tokens"] or 0 for t in conv)})
    times = None
    if shared:
        # how many times the shared prefix went through the model at turn 1
        times = (dec1 - (prompt1 - len(convs) * shared)) / shared
    return {"server": run["server"], "clients": rows, "decoded_turn1": dec1, "prompt_tokens_turn1": prompt1,
            "ideal_decoded_turn1": ideal1 if shared else None, "shared_prefix_tokens": shared,
            "shared_prefilled_times": times, "decoded_all": dec_all, "cached_unreported": unknown,
            "wall_s": run["wall_s"]}


def multi_table(rep: dict) -> str:
    rows = ["| client | turn-1 TTFT | turn-1 prompt tokens | turn-1 cached | turn-1 decoded | decoded, all turns |",
            "|---:|---:|---:|---:|---:|---:|"]
    for c in rep["clients"]:
        rows.append(f"| {c['client']} | {_f(c['ttft_turn1_s'])} | {_n(c['prompt_tokens_turn1'])} | "
                    f"{_n(c['cached_turn1'])} | {_n(c['decoded_turn1'])} | {_n(c['decoded_all'])} |")
    rows.append(f"| all | | {_n(rep['prompt_tokens_turn1'])} | | {_n(rep['decoded_turn1'])} | "
                f"{_n(rep['decoded_all'])} |")
    lines = ["\n".join(rows)]
    if rep["shared_prefix_tokens"]:
        lines.append(f"shared prefix {rep['shared_prefix_tokens']:,} tokens; turn 1 decoded {rep['decoded_turn1']:,} "
                     f"(prefilled once: {rep['ideal_decoded_turn1']:,}) -> shared prefix prefilled "
                     f"~{rep['shared_prefilled_times']:.2f} times"
                     + (" (cached tokens not reported: counted as 0)" if rep["cached_unreported"] else ""))
    lines.append(f"wall time {rep['wall_s']:.1f} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="GGUF path or registry name (default qwen2.5-coder-1.5b; "
                    "--quick: smollm2-135m)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=None, help="port for every server (default: a free port per run)")
    ap.add_argument("--turns", type=int, default=None, help="turns per conversation (default 6; --quick 3)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=None,
                    help="token budget of the system prompt (default 1450; --quick 300)")
    ap.add_argument("--clients", default="1", help="comma list: 1 = the protocol, N > 1 = N concurrent "
                    "conversations sharing the system prompt, --parallel N (e.g. 1,4)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; the server order alternates (ours, native, "
                    "native, ours, ...)")
    ap.add_argument("--ctx", type=int, default=None, help="context per slot (default: enough for the chat, >= 2048)")
    ap.add_argument("--no-repack", action="store_true", help="-nr on both servers (default: llama.cpp's default)")
    ap.add_argument("--native-server", default=None, help="llama-server binary (default: built from the pinned source)")
    ap.add_argument("--skip-native", action="store_true", help="ours only")
    ap.add_argument("--skip-ours", action="store_true", help="native only")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per request")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--log-dir", default=None, help="write each server's stderr there")
    ap.add_argument("--quick", action="store_true", help="smoke run: smollm2-135m, 300-token system prompt, 3 turns")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.model = a.model or ("smollm2-135m" if a.quick else "qwen2.5-coder-1.5b")
    a.turns = a.turns or (3 if a.quick else 6)
    a.system_tokens = a.system_tokens or (300 if a.quick else 1450)
    a.client_counts = sorted({int(x) for x in a.clients.split(",")})
    if min(a.client_counts) < 1 or a.turns < 1 or a.rounds < 1:
        ap.error("--clients, --turns and --rounds must be >= 1")
    if a.skip_native and a.skip_ours:
        ap.error("--skip-native and --skip-ours leave nothing to measure")
    return a


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)  # the finally blocks stop the servers
    if a.log_dir:
        Path(a.log_dir).mkdir(parents=True, exist_ok=True)
    from llama_spec.chat_api import prepare_prompt
    from llama_spec.llama.model import Model
    from llama_spec.models.registry import resolve_model

    model_path = Path(a.model) if Path(a.model).exists() else resolve_model(a.model)
    vocab = Model(model_path, vocab_only=True)
    try:
        system, sys_tokens, origin = build_system_prompt(
            lambda s: len(vocab.tokenize(s, add_special=False)), a.system_tokens)
        # the rendered turn-1 prompts: their length and the prefix all clients share
        firsts = [prepare_prompt(vocab, [{"role": "system", "content": system},
                                         {"role": "user", "content": questions(k, 1)[0]}]).tokens
                  for k in range(max(a.client_counts))]
    finally:
        vocab.close()
    shared = min(common_prefix(firsts[0], f) for f in firsts[1:]) if len(firsts) > 1 else None
    if a.ctx is None:
        a.ctx = max(2048, -(-(len(firsts[0]) + a.turns * (a.max_tokens + 64) + 64) // 256) * 256)
    print(f"system prompt: {sys_tokens:,} tokens of {model_path.name} ({origin}); turn-1 prompt "
          f"{len(firsts[0]):,} tokens (rendered here); {a.turns} turns x {a.max_tokens} tokens; ctx {a.ctx}/slot; "
          f"threads {a.threads}", file=sys.stderr)
    machine = machine_info()
    binary = native_binary(a)
    if binary is None and not a.skip_native:
        raise SystemExit("no native llama-server")
    names = [n for n in ("ours", "native") if not (n == "ours" and a.skip_ours) and not (n == "native" and binary is None)]
    env = dict(os.environ, LLAMA_LOG_COLORS="0")
    runs: list[dict] = []
    try:
        for r in range(a.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n_clients in a.client_counts:
                for name in order:
                    port = a.port or free_port()
                    cmd = (ours_cmd(a, model_path, n_clients, port) if name == "ours"
                           else native_cmd(a, binary, model_path, n_clients, port))
                    print(f"round {r + 1}/{a.rounds}, {n_clients} client(s): {name} ({loadavg()})", file=sys.stderr)
                    run = run_server(name, cmd, port, a, system, n_clients, env=env)
                    run["round"] = r + 1
                    runs.append(run)
                    conv0 = run["conversations"][0]
                    print(f"  {name}: turn TTFTs " + ", ".join(_f(t["ttft_s"]) for t in conv0)
                          + f"; wall {run['wall_s']:.1f} s", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: the servers are stopped", file=sys.stderr)
        return 130

    res: dict[str, Any] = {
        "kind": "bench_chat_turns", "quick": a.quick, "machine": machine,
        "config": {"model": str(model_path), "threads": a.threads, "turns": a.turns, "max_tokens": a.max_tokens,
                   "system_prompt_tokens": sys_tokens, "system_prompt_source": origin,
                   "system_prompt_sha256": hashlib.sha256(system.encode()).hexdigest(),
                   "turn1_prompt_tokens_rendered": len(firsts[0]), "ctx_per_slot": a.ctx, "clients": a.client_counts,
                   "rounds": a.rounds, "no_repack": a.no_repack, "native_server": str(binary) if binary else None},
        "runs": runs,
    }
    print(f"\n{machine['cpu']}, {machine['cores']} cores; {model_path.name}; system prompt {sys_tokens:,} tokens; "
          f"-t {a.threads}; {machine['uptime']}")
    if 1 in a.client_counts:
        for run in (x for x in runs if x["clients"] == 1):
            print(f"\n### {run['server']} (round {run['round']}, --parallel 1)\n")
            print(turn_table(run))
        res["summary"] = single_summary(runs)
        print_single_summary(res["summary"])
    multi = []
    for run in (x for x in runs if x["clients"] > 1):
        rep = multi_report(run, shared)
        rep["round"] = run["round"]
        multi.append(rep)
        print(f"\n### {run['server']}, {run['clients']} clients sharing the system prompt "
              f"(round {run['round']}, --parallel {run['clients']})\n")
        print(multi_table(rep))
    if multi:
        res["multi"] = multi
    machine["uptime_after"] = loadavg()
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
