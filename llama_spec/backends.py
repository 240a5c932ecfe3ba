"""Devices llama.cpp sees (like `--list-devices`) and RPC servers registered as devices."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ._ffi import ffi, lib

_TYPES = {
    lib.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    lib.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
}


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    type: str
    backend: str
    memory_free: int
    memory_total: int


def _describe(dev) -> Device:
    free = ffi.new("size_t *")
    total = ffi.new("size_t *")
    lib.ggml_backend_dev_memory(dev, free, total)
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return Device(
        name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
        description=ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
        type=_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
        backend=ffi.string(lib.ggml_backend_reg_name(reg)).decode() if reg != ffi.NULL else "",
        memory_free=int(free[0]),
        memory_total=int(total[0]),
    )


def devices() -> list[Device]:
    """Every device registered with ggml, in llama.cpp's order (RPC devices once added)."""
    return [_describe(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def device_handle(name: str):
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        known = ", ".join(d.name for d in devices())
        raise ValueError(f"unknown device {name!r}; llama.cpp sees: {known}")
    return dev


_rpc_added: dict[str, list[str]] = {}


def add_rpc_server(endpoint: str, *, timeout: float = 5.0) -> list[str]:
    """Register the devices of the rpc-server at `endpoint` ("host:port"); return their names.

    A plain TCP connect is tried first (bounded by `timeout`) so an unreachable endpoint
    fails fast with a clear error instead of inside ggml.
    """
    if endpoint in _rpc_added:
        return _rpc_added[endpoint]
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"RPC endpoint {endpoint!r} must look like host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ConnectionError(f"RPC server {endpoint} is unreachable: {e}") from None
    before = {d.name for d in devices()}
    reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
    if reg == ffi.NULL:
        raise ConnectionError(f"RPC server {endpoint}: ggml-rpc could not register it (see the log)")
    lib.ggml_backend_register(reg)  # as llama.cpp's own --rpc does
    names = [d.name for d in devices() if d.name not in before]
    _rpc_added[endpoint] = names
    return names
