"""``llama-spec serve``: the OpenAI-compatible server (needs the ``[server]`` extra).

    llama-spec serve -m MODEL [-md DRAFT | --spec-type draft-mtp] --parallel N \\
        [--host 127.0.0.1] [--port 8080] [--api-key KEY] [-c N] [-t N] [-nr]

Binds 127.0.0.1 unless told otherwise. ``-c`` is the context of one slot (llama-server divides
its ``-c`` among the slots; here the KV cache holds ``-c`` x ``--parallel`` tokens). Ctrl-C or
SIGTERM: uvicorn stops accepting, open streams get a few seconds, then the worker thread stops
and every context and model is freed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .args import add_model_args, add_spec_type_args

__all__ = ["SERVER_INSTALL_HINT", "add_parser", "add_serve_parser", "build_engine", "cmd_serve",
           "missing_server_extra", "run"]

log = logging.getLogger("llama_spec.server")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` command to an argparse subparsers object."""
    s: argparse.ArgumentParser = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (loopback by default)",
                              description="-c/--ctx-size is the context of ONE slot here (llama-server divides "
                                          "its -c among the slots).")
    add_model_args(s)
    add_spec_type_args(s)
    s.add_argument("-np", "--parallel", type=int, default=4, help="slots (sequences decoded together)")
    s.add_argument("--queue-size", type=int, default=64, help="requests that may wait for a slot (then 503)")
    s.add_argument("-cram", "--cache-ram", type=float, default=DEFAULT_CACHE_RAM, metavar="MiB",
                   help="host-RAM prompt cache: saved conversation states, LRU, at most this many MiB "
                        f"(0 = off; default {DEFAULT_CACHE_RAM:g}); docs/prompt-cache.md")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env LLAMA_API_KEY)")
    s.add_argument("-a", "--alias", default=None, help="model name in the API (default: the file name)")
    s.add_argument("--chat-template-file", default=None, help="jinja template instead of the GGUF's")
    s.add_argument("--timeout-graceful", type=float, default=5.0, help="seconds open streams get at shutdown")
    s.set_defaults(func=cmd_serve)
    return s


add_parser = add_serve_parser  # the cli package's command-module convention
DEFAULT_CACHE_RAM = 1024.0  # MiB (llama-server's default is 8192; these machines have 24 GB)


def build_engine(ns: argparse.Namespace) -> tuple[Any, Any, list[Callable[[], None]], str]:
    """(engine, target model, closers, speculative mode) from parsed args; the engine is not started."""
    from ..generation.batch import BatchGenerator, SlotFactory
    from ..server.engine import ServerEngine
    from .build import auto_args, context_options, drafter_factory, load_models, spec_n_max, spec_types

    types = spec_types(ns)
    mode = ",".join(types) or "none"
    if ns.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {ns.parallel}")
    if not ns.cache_ram >= 0:
        raise ValueError(f"--cache-ram must be >= 0 MiB (0 = off), got {ns.cache_ram}")
    target, dmodel = load_models(ns, types)
    closers: list[Callable[[], None]] = [target.close]
    factory, draft_closers = drafter_factory(ns, target, types, dmodel)
    closers[:0] = draft_closers  # the draft model is freed before the target
    n_max, ctx_opts, auto = spec_n_max(ns, types), context_options(ns), auto_args(ns, cache=False)
    # (the server learns as it runs: it neither reads nor writes the CLI's cost-model cache)
    tree = getattr(ns, "spec_draft_tree", None)
    if tree and isinstance(factory, SlotFactory):
        factory = factory.__call__  # a tree branches the draft KV: a draft context per slot, not a shared one

    def make_batch() -> Any:  # runs in the engine's worker thread, which then owns the contexts
        return BatchGenerator(target, factory, n_parallel=ns.parallel, n_ctx=ns.ctx_size,
                              n_batch=ns.batch_size, n_threads=ns.threads, n_max=n_max,
                              context_options=ctx_opts, tree=tree,
                              adaptive_draft=getattr(ns, "spec_draft_adaptive", False), cache_ram=ns.cache_ram,
                              **auto)

    return ServerEngine(make_batch, max_queue=ns.queue_size), target, closers, mode


class _Terminated(Exception):
    """SIGTERM arrived (re-raised by uvicorn after its graceful shutdown)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


SERVER_INSTALL_HINT = "pip install 'llama-spec[server]'"


def missing_server_extra() -> str | None:
    """The first package of the ``[server]`` extra that cannot be imported, or None."""
    for name in ("uvicorn", "starlette"):
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


_M_MMAP_THRESHOLD = -3  # glibc malloc.h


def big_blocks_from_mmap(threshold: int = 4 << 20) -> bool:
    """Blocks of >= threshold bytes (saved prompt states, MiBs each) straight from mmap, so that
    freeing one returns it to the OS. glibc otherwise raises its mmap threshold after the first
    such free and serves later ones from the heap, which fragments: 200 conversations through a
    256 MiB prompt cache grew the server's RSS by 351 MiB (scripts/bench_cache_memory.py).
    False where this is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


def cmd_serve(ns: argparse.Namespace) -> int:
    """Load, start the worker, run uvicorn until Ctrl-C/SIGTERM, then stop and free everything."""
    missing = missing_server_extra()
    if missing is not None:  # one line and exit 2, before any model is loaded
        print(f"llama-spec serve needs the server extra ({missing} is not installed): {SERVER_INSTALL_HINT}",
              file=sys.stderr)
        return 2
    import uvicorn

    from ..server.app import ServerConfig, create_app

    api_key = ns.api_key or os.environ.get("LLAMA_API_KEY") or None
    if ns.host not in _LOOPBACK:
        print(f"llama-spec serve: WARNING: binding {ns.host} exposes the server beyond this machine"
              + ("" if api_key else " with no --api-key"), file=sys.stderr)
    template = Path(ns.chat_template_file).read_text() if ns.chat_template_file else None
    if ns.cache_ram > 0:
        big_blocks_from_mmap()
    engine, target, closers, mode = build_engine(ns)
    old = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        engine.start()
        if mode != "none":   # numba's set-up for sampled verification, while the server waits for requests
            from ..kernels.warmup import warm_up_in_background
            warm_up_in_background()
        name = ns.alias or Path(target.path).name
        app = create_app(engine, target, ServerConfig(model_name=name, api_key=api_key, speculative_mode=mode,
                                                      chat_template=template))
        print(f"llama-spec serve: {name} ({mode}), {engine.n_parallel} slots x {engine.n_ctx_per_seq} tokens, "
              f"http://{ns.host}:{ns.port}/v1", file=sys.stderr, flush=True)
        config = uvicorn.Config(app, host=ns.host, port=ns.port, lifespan="off", access_log=ns.verbose > 0,
                                log_level="info" if ns.verbose else "warning",
                                timeout_graceful_shutdown=ns.timeout_graceful)
        uvicorn.Server(config).run()
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        if engine.stop():
            for fn in closers:
                fn()
        else:  # the worker is still decoding: leave the models to the OS rather than free them under it
            print("llama-spec serve: the worker did not stop in time; exiting without freeing the models",
                  file=sys.stderr)
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        print("llama-spec serve: stopped", file=sys.stderr, flush=True)
    return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


run = cmd_serve
