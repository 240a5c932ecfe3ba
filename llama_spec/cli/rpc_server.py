"""``llama-spec rpc-server``: llama.cpp's ggml-rpc-server in place of this process.

The RPC protocol is unauthenticated: loopback by default, a warning for any other address
(the rule is :func:`llama_spec.rpc.is_loopback`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .args import add_verbose_arg


def add_parser(sub: Any) -> None:
    r = sub.add_parser("rpc-server", help="run llama.cpp's rpc-server (unauthenticated: loopback by default)")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=50052)
    r.add_argument("-t", "--threads", type=int, default=None)
    r.add_argument("-d", "--device", default=None)
    add_verbose_arg(r)
    r.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    """exec the packaged server (never returns on success)."""
    from ..rpc.servers import UNSAFE_HOST_WARNING, is_loopback, rpc_server_binary

    if not is_loopback(ns.host):
        print("WARNING: " + UNSAFE_HOST_WARNING.format(host=ns.host), file=sys.stderr)
    args = [str(rpc_server_binary()), "-H", ns.host, "-p", str(ns.port)]
    if ns.threads:
        args += ["-t", str(ns.threads)]
    if ns.device:
        args += ["-d", ns.device]
    os.execv(args[0], args)
    return 1  # pragma: no cover
