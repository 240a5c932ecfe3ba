"""``llama-spec devices``: the devices llama.cpp sees (like ``--list-devices``), RPC ones included."""

from __future__ import annotations

import argparse
from typing import Any

from .args import add_verbose_arg


def add_parser(sub: Any) -> None:
    d = sub.add_parser("devices", help="list the devices llama.cpp sees (like --list-devices)")
    d.add_argument("--rpc", default=None, help="comma-separated rpc-server endpoints host:port to add first")
    add_verbose_arg(d)
    d.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    """One line per device: name, description, type, backend, memory."""
    from ..llama.devices import add_rpc_server, devices

    for ep in (ns.rpc.split(",") if ns.rpc else []):
        add_rpc_server(ep.strip())
    for d in devices():
        print(f"{d.name}: {d.description} ({d.type}, {d.backend}, {d.memory_free // 2**20} MiB free of "
              f"{d.memory_total // 2**20} MiB)")
    return 0
