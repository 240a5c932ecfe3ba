"""`llama-spec` command line. stdout carries only generated text; logs and stats go to stderr.

Flags follow llama.cpp's names (-m, -p, -n, -c, -t, -ngl, --temp, --top-k, ..., -md,
--spec-type, --spec-draft-n-max, --spec-draft-p-min, --spec-draft-sample).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("llama_spec.cli")


def _resolve(name: str) -> Path:
    from .testing.models import resolve_model

    return resolve_model(name)


def _add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-m", "--model", default=None, help="GGUF path, or a test model name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096)")
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="layers on the GPU (-1 = all)")
    ap.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row", "tensor"])
    ap.add_argument("-ts", "--tensor-split", default=None, help="comma-separated weights, e.g. 60,40")
    ap.add_argument("-mg", "--main-gpu", type=int, default=0)
    ap.add_argument("--rpc", default=None, help="comma-separated rpc-server endpoints host:port")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="-v: info log, -vv: llama.cpp debug log")


def _add_sampling_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("--typical", type=float, default=1.0)
    ap.add_argument("--top-n-sigma", type=float, default=-1.0)
    ap.add_argument("--repeat-penalty", type=float, default=1.0)
    ap.add_argument("--repeat-last-n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random)")
    ap.add_argument("--grammar", default=None, help="GBNF grammar text")
    ap.add_argument("--grammar-file", default=None)


def _add_spec_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--spec-type", default=None, choices=["none", "draft-simple", "draft-mtp"],
                    help="speculative decoding (default: draft-simple with -md, else none)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft model for draft-simple")
    ap.add_argument("--spec-draft-n-max", type=int, default=3, help="draft tokens per verification (1-64)")
    ap.add_argument("--spec-draft-p-min", type=float, default=0.0, help="stop drafting below this confidence")
    ap.add_argument("--spec-draft-sample", dest="spec_draft_sample", action="store_true", default=None,
                    help="rejection rule: sample drafts, verify by rejection sampling (default; env LLAMA_ARG_SPEC_DRAFT_SAMPLE)")
    ap.add_argument("--no-spec-draft-sample", dest="spec_draft_sample", action="store_false",
                    help="exact-match rule (the old behaviour)")
    ap.add_argument("--spec-draft-device", default=None, help="device name for the draft model (see `llama-spec devices`)")
    ap.add_argument("--spec-topk-stats", action="store_true", default=None, help="per-position top-k draft statistics (env LLAMA_MTP_TOPK_STATS)")
    ap.add_argument("--spec-topk-stats-every", type=int, default=None, help="report every N verifications (env LLAMA_MTP_TOPK_STATS_EVERY, default 128)")
    ap.add_argument("--spec-topk-stats-json", default=None, metavar="FILE")
    ap.add_argument("--spec-topk-stats-plot", default=None, metavar="FILE")


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(stream=sys.stderr, level=level, format="%(levelname)s %(name)s: %(message)s")
    # llama.cpp's own log is chatty: show its warnings by default, everything with -vv.
    logging.getLogger("llama_spec.llama_cpp").setLevel(logging.WARNING if verbose < 2 else logging.DEBUG)


def _sampling(ns):
    from .sampling import SamplerParams

    grammar = ns.grammar
    if ns.grammar_file:
        grammar = Path(ns.grammar_file).read_text()
    return SamplerParams(temp=ns.temp, top_k=ns.top_k, top_p=ns.top_p, min_p=ns.min_p, typical_p=ns.typical,
                         top_n_sigma=ns.top_n_sigma, penalty_repeat=ns.repeat_penalty,
                         penalty_last_n=ns.repeat_last_n, grammar=grammar)


def _load(ns, *, load_mtp: bool = False):
    from .model import Model

    ts = [float(x) for x in ns.tensor_split.split(",")] if ns.tensor_split else None
    rpc = [x.strip() for x in ns.rpc.split(",")] if ns.rpc else None
    if not ns.model:
        raise ValueError("-m/--model is required (chat also accepts -hf REPO[:QUANT])")
    path = _resolve(ns.model)
    print(f"llama-spec: loading {path}", file=sys.stderr)
    return Model(path, n_gpu_layers=ns.n_gpu_layers, split_mode=ns.split_mode, tensor_split=ts,
                 main_gpu=ns.main_gpu, rpc_servers=rpc, load_mtp=load_mtp)


def build_generator(ns):
    """Target model, drafter and generator from parsed CLI args (shared by generate and chat)."""
    from .drafters.draft_model import DraftModelDrafter
    from .drafters.mtp import MtpDrafter
    from .model import Model
    from .speculative import SpeculativeGenerator

    spec_type = ns.spec_type or ("draft-simple" if ns.model_draft else "none")
    if spec_type == "draft-simple" and not ns.model_draft:
        raise SystemExit("error: --spec-type draft-simple needs -md/--model-draft")
    target = _load(ns, load_mtp=spec_type == "draft-mtp")
    drafter = None
    if spec_type == "draft-simple":
        dpath = _resolve(ns.model_draft)
        print(f"llama-spec: loading draft {dpath}", file=sys.stderr)
        devs = [ns.spec_draft_device] if ns.spec_draft_device else None
        dmodel = Model(dpath, n_gpu_layers=ns.n_gpu_layers, devices=devs)
        drafter = DraftModelDrafter(dmodel, n_ctx=ns.ctx_size, n_threads=ns.threads)
    elif spec_type == "draft-mtp":
        drafter = MtpDrafter(target, n_ctx=ns.ctx_size, n_threads=ns.threads)
    gen = SpeculativeGenerator(target, drafter, n_ctx=ns.ctx_size, n_batch=ns.batch_size,
                               n_threads=ns.threads, n_max=ns.spec_draft_n_max)
    topk = _topk_stats(ns, gen)
    return gen, topk


def _topk_stats(ns, gen):
    from .stats import TopKStats, topk_settings

    enabled, every = topk_settings(ns.spec_topk_stats, ns.spec_topk_stats_every)
    if not enabled or gen.drafter is None:
        return None
    st = TopKStats(every=every, log=lambda s: print(s, file=sys.stderr))
    st.attach(gen)
    return st


def _finish_topk(ns, topk) -> None:
    if topk is None:
        return
    print(topk.table(), file=sys.stderr)
    if ns.spec_topk_stats_json:
        Path(ns.spec_topk_stats_json).write_text(json.dumps(topk.as_dict(), indent=2))
    if ns.spec_topk_stats_plot:
        topk.plot(ns.spec_topk_stats_plot)


def cmd_generate(ns) -> int:
    gen, topk = build_generator(ns)
    prompt = ns.prompt if ns.prompt is not None else Path(ns.file).read_text()
    out: list = []
    for ev in gen.stream(prompt, sampling=_sampling(ns), n_predict=ns.n_predict, seed=ns.seed,
                         spec_draft_sample=ns.spec_draft_sample, n_max=ns.spec_draft_n_max,
                         p_min=ns.spec_draft_p_min, ignore_eos=ns.ignore_eos, result=out):
        if ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    res = out[0]
    st = res.stats
    rule = "none" if gen.drafter is None else ("rejection" if res.spec_draft_sample else "exact-match")
    print(f"\nllama-spec: stop={res.stop_reason} prompt={st.n_prompt} tokens, generated={st.emitted} tokens, "
          f"decode {st.decode_tps:.2f} t/s, prefill {st.t_prompt_s:.2f} s", file=sys.stderr)
    if gen.drafter is not None:
        print(f"llama-spec: rule={rule} {gen.drafter.name}: verifications={st.verifications} drafted={st.drafted} "
              f"accepted={st.accepted} ({100 * st.acceptance_rate:.1f} %) recovered={st.recovered} bonus={st.bonus} "
              f"mean_accepted_length={st.mean_accepted_length:.2f} extra_accepted={st.extra_accepted}", file=sys.stderr)
    if ns.stats_json:
        Path(ns.stats_json).write_text(json.dumps({"rule": rule, "stop_reason": res.stop_reason,
                                                   "tokens": res.tokens, **st.as_dict()}, indent=2))
    _finish_topk(ns, topk)
    return 0


def cmd_devices(ns) -> int:
    from .backends import add_rpc_server, devices

    for ep in (ns.rpc.split(",") if ns.rpc else []):
        add_rpc_server(ep.strip())
    for d in devices():
        print(f"{d.name}: {d.description} ({d.type}, {d.backend}, {d.memory_free // 2**20} MiB free of {d.memory_total // 2**20} MiB)")
    return 0


def rpc_server_binary() -> Path:
    p = Path(__file__).resolve().parent / "_lib" / "ggml-rpc-server"
    if not p.exists():
        raise SystemExit(f"error: {p} is missing (the package was built without the RPC server)")
    return p


def cmd_rpc_server(ns) -> int:
    if ns.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"WARNING: the RPC protocol is unauthenticated; binding {ns.host} exposes this machine. "
              "Never face an untrusted network.", file=sys.stderr)
    args = [str(rpc_server_binary()), "-H", ns.host, "-p", str(ns.port)]
    if ns.threads:
        args += ["-t", str(ns.threads)]
    if ns.device:
        args += ["-d", ns.device]
    os.execv(args[0], args)
    return 1  # pragma: no cover


def cmd_chat(ns) -> int:
    from .chat_api import cli_chat

    return cli_chat(ns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llama-spec", description="llama.cpp from Python with exact speculative decoding")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text (stdout) from a prompt")
    _add_model_args(g)
    _add_sampling_args(g)
    _add_spec_args(g)
    g.add_argument("-p", "--prompt", default=None)
    g.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    g.add_argument("-n", "--n-predict", type=int, default=128)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--stats-json", default=None, metavar="FILE", help="write the run's counters as JSON")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="chat with a model (REPL, or one-shot with -p)")
    _add_model_args(c)
    _add_sampling_args(c)
    _add_spec_args(c)
    c.add_argument("-p", "--prompt", default=None, help="one-shot user message")
    c.add_argument("-sys", "--system-prompt", default=None)
    c.add_argument("-n", "--n-predict", type=int, default=512)
    c.add_argument("--reasoning-budget", type=int, default=None)
    c.add_argument("--enable-thinking", dest="enable_thinking", action="store_true", default=None)
    c.add_argument("--no-thinking", dest="enable_thinking", action="store_false")
    c.add_argument("-hf", "--hf-repo", default=None, help="Hugging Face repo[:quant] instead of -m")
    c.set_defaults(func=cmd_chat)

    d = sub.add_parser("devices", help="list the devices llama.cpp sees (like --list-devices)")
    d.add_argument("--rpc", default=None)
    d.add_argument("-v", "--verbose", action="count", default=0)
    d.set_defaults(func=cmd_devices)

    r = sub.add_parser("rpc-server", help="run llama.cpp's rpc-server (unauthenticated: loopback by default)")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=50052)
    r.add_argument("-t", "--threads", type=int, default=None)
    r.add_argument("-d", "--device", default=None)
    r.add_argument("-v", "--verbose", action="count", default=0)
    r.set_defaults(func=cmd_rpc_server)

    from .errors import LlamaSpecError

    ns = ap.parse_args(argv)
    _setup_logging(getattr(ns, "verbose", 0))
    if ns.cmd in ("generate",) and ns.prompt is None and ns.file is None:
        ap.error("generate needs -p PROMPT or -f FILE")
    try:
        return ns.func(ns)
    except (ValueError, OSError, LlamaSpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except subprocess.CalledProcessError as e:  # pragma: no cover
        print(f"error: {e}", file=sys.stderr)
        return e.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
