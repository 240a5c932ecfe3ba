"""The ``llama-spec`` command line: one module per command (generate, chat, serve, tune, devices, rpc-server).

stdout carries only generated text; logs and statistics go to stderr. Flags follow llama.cpp's
names (-m, -p, -n, -c, -t, -ngl, --temp, --top-k, ..., -md, --spec-type, --spec-draft-n-max,
--spec-draft-p-min, --spec-draft-sample). A command module has ``add_parser(subparsers)``, which
sets ``func`` (its ``run(ns) -> exit code``) as the parser's default.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

from ..errors import LlamaSpecError
from . import chat, devices, generate, rpc_server, serve, tune

__all__ = ["COMMANDS", "main"]

log = logging.getLogger("llama_spec.cli")

#: The command modules, in --help order.
COMMANDS = (generate, chat, serve, tune, devices, rpc_server)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(stream=sys.stderr, level=level, format="%(levelname)s %(name)s: %(message)s")
    # llama.cpp's own log is chatty: show its warnings by default, everything with -vv.
    logging.getLogger("llama_spec.llama_cpp").setLevel(logging.WARNING if verbose < 2 else logging.DEBUG)


def build_parser() -> argparse.ArgumentParser:
    """The full parser: every command module adds its subcommand."""
    ap = argparse.ArgumentParser(prog="llama-spec", description="llama.cpp from Python with exact speculative decoding")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in COMMANDS:
        cmd.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (2 for a usage or input error)."""
    ap = build_parser()
    ns = ap.parse_args(argv)
    _setup_logging(getattr(ns, "verbose", 0))
    if getattr(ns, "needs_prompt", False) and ns.prompt is None and ns.file is None:
        ap.error(f"{ns.cmd} needs -p PROMPT or -f FILE")
    try:
        code: int = ns.func(ns)
        return code
    except (ValueError, OSError, LlamaSpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except subprocess.CalledProcessError as e:  # pragma: no cover
        print(f"error: {e}", file=sys.stderr)
        return e.returncode or 1
