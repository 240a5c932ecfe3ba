"""Devices llama.cpp sees (like `--list-devices`) and RPC servers registered as devices."""

from __future__ import annotations

from dataclasses import dataclass

from . import rpc as _rpc
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


def _describe(dev, *, memory: bool = True) -> Device:
    free = ffi.new("size_t *")
    total = ffi.new("size_t *")
    reg = lib.ggml_backend_dev_backend_reg(dev)
    backend = ffi.string(lib.ggml_backend_reg_name(reg)).decode() if reg != ffi.NULL else ""
    description = ffi.string(lib.ggml_backend_dev_description(dev)).decode()
    # An RPC device's memory query is a round trip to its server (a new connection when none
    # is open); ggml-rpc aborts the process if that fails, so ask only servers known to answer.
    if memory and (backend != "RPC" or _rpc.endpoint_usable(description, timeout=1.0)[0]):
        lib.ggml_backend_dev_memory(dev, free, total)
    return Device(
        name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
        description=description,
        type=_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
        backend=backend,
        memory_free=int(free[0]),
        memory_total=int(total[0]),
    )


def devices(*, memory: bool = True) -> list[Device]:
    """Every device registered with ggml, in llama.cpp's order (RPC devices once added).

    Memory of an RPC device whose server does not answer (or was lost) reads as 0.
    `memory=False` skips the memory queries (no network traffic at all).
    """
    return [_describe(lib.ggml_backend_dev_get(i), memory=memory) for i in range(lib.ggml_backend_dev_count())]


def rpc_endpoint_of(name: str) -> str | None:
    """The "host:port" of RPC device `name` (ggml-rpc's device description), None if not RPC."""
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        return None
    reg = lib.ggml_backend_dev_backend_reg(dev)
    if reg == ffi.NULL or ffi.string(lib.ggml_backend_reg_name(reg)).decode() != "RPC":
        return None
    return ffi.string(lib.ggml_backend_dev_description(dev)).decode()


def local_offload_devices() -> list[str]:
    """llama.cpp's default model devices without RPC ones: GPUs, else integrated GPUs (one backend)."""
    gpus, igpus = [], []
    for d in devices(memory=False):
        if d.backend == "RPC":
            continue
        if d.type == "gpu":
            gpus.append(d)
        elif d.type == "igpu" and (not igpus or igpus[-1].backend == d.backend):
            igpus.append(d)
    return [d.name for d in (gpus or igpus)]


def device_handle(name: str):
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        known = ", ".join(d.name for d in devices())
        raise ValueError(f"unknown device {name!r}; llama.cpp sees: {known}")
    return dev


_rpc_added: dict[str, list[str]] = {}


def add_rpc_server(endpoint: str, *, timeout: float = 5.0) -> list[str]:
    """Register the devices of the rpc-server at `endpoint` ("host:port"); return their names.

    The RPC handshake is tried first, bounded by `timeout` seconds, so an unreachable, busy
    or foreign endpoint fails with a clear :class:`~llama_spec.rpc.RpcConnectionError` instead
    of ggml-rpc's abort() or an endless wait. Registering also installs the abort callback
    that lets :func:`llama_spec.rpc.call_guarded` survive a server lost later.
    """
    _rpc.parse_endpoint(endpoint)
    _rpc.check_not_lost(endpoint)
    if endpoint in _rpc_added:
        return _rpc_added[endpoint]
    _rpc.probe(endpoint, timeout=timeout)
    _rpc.install_abort_handler()
    reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
    if reg == ffi.NULL:
        raise _rpc.RpcConnectionError(endpoint, "reports no devices (see the log)")
    lib.ggml_backend_register(reg)  # as llama.cpp's own --rpc does
    names = [ffi.string(lib.ggml_backend_dev_name(lib.ggml_backend_reg_dev_get(reg, i))).decode()
             for i in range(lib.ggml_backend_reg_dev_count(reg))]
    _rpc_added[endpoint] = names
    _rpc.note_registered(endpoint)
    return names
