"""Devices llama.cpp sees (like ``--list-devices``), RPC servers registered as devices, and
where a model's layers go (:func:`place_model`: devices, split mode, ``tensor_split``, ``main_gpu``).

Every RPC endpoint is recorded once, in the endpoint registry of :mod:`llama_spec._handle`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import rpc as _rpc
from .._ffi import ensure_init, ffi, lib
from .._handle import endpoints as _registry
from ..errors import RpcConnectionError
from ..types import SplitMode

__all__ = ["SPLIT_MODES", "Device", "Placement", "add_rpc_server", "devices", "local_offload_devices",
           "place_model", "rpc_endpoint_of"]

SPLIT_MODES: dict[str, int] = {
    "none": lib.LLAMA_SPLIT_MODE_NONE,
    "layer": lib.LLAMA_SPLIT_MODE_LAYER,
    "row": lib.LLAMA_SPLIT_MODE_ROW,
    "tensor": lib.LLAMA_SPLIT_MODE_TENSOR,
}

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
    type: str       # "cpu" | "gpu" | "igpu" | "accel" | "other"
    backend: str    # the ggml backend registry's name ("CPU", "CUDA", "RPC", ...)
    memory_free: int
    memory_total: int


def describe(dev: Any, *, memory: bool = True) -> Device:
    """A ggml device handle as a :class:`Device` (memory queried unless `memory` is False)."""
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
    ensure_init()
    return [describe(lib.ggml_backend_dev_get(i), memory=memory) for i in range(lib.ggml_backend_dev_count())]


def rpc_endpoint_of(name: str) -> str | None:
    """The "host:port" of RPC device `name` (ggml-rpc's device description), None if not RPC."""
    ensure_init()
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        return None
    reg = lib.ggml_backend_dev_backend_reg(dev)
    if reg == ffi.NULL or ffi.string(lib.ggml_backend_reg_name(reg)).decode() != "RPC":
        return None
    return str(ffi.string(lib.ggml_backend_dev_description(dev)).decode())


def local_offload_devices() -> list[str]:
    """llama.cpp's default model devices without RPC ones: GPUs, else integrated GPUs (one backend)."""
    gpus: list[Device] = []
    igpus: list[Device] = []
    for d in devices(memory=False):
        if d.backend == "RPC":
            continue
        if d.type == "gpu":
            gpus.append(d)
        elif d.type == "igpu" and (not igpus or igpus[-1].backend == d.backend):
            igpus.append(d)
    return [d.name for d in (gpus or igpus)]


def device_handle(name: str) -> Any:
    """The ggml device called `name`; ValueError naming the known ones otherwise."""
    ensure_init()
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        known = ", ".join(d.name for d in devices())
        raise ValueError(f"unknown device {name!r}; llama.cpp sees: {known}")
    return dev


def add_rpc_server(endpoint: str, *, timeout: float = 5.0) -> list[str]:
    """Register the devices of the rpc-server at `endpoint` ("host:port"); return their names.

    The RPC handshake is tried first, bounded by `timeout` seconds, so an unreachable, busy
    or foreign endpoint fails with a clear :class:`~llama_spec.errors.RpcConnectionError` instead
    of ggml-rpc's abort() or an endless wait. Registering also installs the abort callback
    that lets :func:`llama_spec.rpc.call_guarded` survive a server lost later.
    """
    ensure_init()
    _rpc.parse_endpoint(endpoint)
    _rpc.check_not_lost(endpoint)
    known = _registry.devices_of(endpoint)
    if known is not None:
        return list(known)
    _rpc.probe(endpoint, timeout=timeout)
    _rpc.install_abort_handler()
    reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
    if reg == ffi.NULL:
        raise RpcConnectionError(endpoint, "reports no devices (see the log)")
    lib.ggml_backend_register(reg)  # as llama.cpp's own --rpc does
    names = [ffi.string(lib.ggml_backend_dev_name(lib.ggml_backend_reg_dev_get(reg, i))).decode()
             for i in range(lib.ggml_backend_reg_dev_count(reg))]
    _registry.note_registered(endpoint, names)
    return names


# -- placing a model ---------------------------------------------------------------------------
@dataclass
class Placement:
    """Where a model's layers go, as llama_model_params wants it, plus the RPC servers used.

    ``devices`` None leaves llama.cpp's default selection; ``tensor_split`` None its even split.
    """

    split_mode: SplitMode
    main_gpu: int
    devices: list[str] | None
    tensor_split: list[float] | None
    rpc_endpoints: tuple[str, ...]

    def apply(self, params: Any) -> list[Any]:
        """Fill `params` (llama_model_params); return the cffi arrays that must outlive the load."""
        keep: list[Any] = []
        params.split_mode = SPLIT_MODES[self.split_mode]
        params.main_gpu = int(self.main_gpu)
        if self.devices is not None:
            arr = ffi.new("ggml_backend_dev_t[]", [*(device_handle(n) for n in self.devices), ffi.NULL])
            params.devices = arr
            keep.append(arr)
        if self.tensor_split is not None:
            ts = self.tensor_split
            arr = ffi.new("float[]", ts + [0.0] * (lib.llama_max_devices() - len(ts)))
            params.tensor_split = arr
            keep.append(arr)
        return keep


def _check_tensor_split(tensor_split: Sequence[float] | None) -> list[float] | None:
    if tensor_split is None:
        return None
    ts = [float(x) for x in tensor_split]
    if any(not np.isfinite(x) or x < 0 for x in ts):
        raise ValueError(f"tensor_split {ts}: weights must be finite and non-negative")
    if not any(ts):
        raise ValueError(f"tensor_split {ts}: at least one weight must be positive")
    if len(ts) > lib.llama_max_devices():
        raise ValueError(f"tensor_split longer than llama_max_devices() = {lib.llama_max_devices()}")
    return ts


def n_offload_devices() -> int:
    """Devices that can hold layers when none are named: GPUs and RPC devices."""
    return sum(1 for d in devices(memory=False) if d.type in ("gpu", "igpu") or d.backend == "RPC")


def place_model(*, split_mode: SplitMode = "layer", tensor_split: Sequence[float] | None = None,
                main_gpu: int = 0, devices: Sequence[str] | None = None,
                rpc_servers: Sequence[str] | None = None) -> Placement:
    """Check the placement arguments of :class:`~llama_spec.Model` and choose its devices.

    Everything that can be checked without the network is checked first; then the RPC servers
    are registered and each must answer (ggml-rpc aborts the process on one that does not).
    """
    if split_mode not in SPLIT_MODES:
        raise ValueError(f"split_mode {split_mode!r}: expected one of {', '.join(SPLIT_MODES)}")
    ts = _check_tensor_split(tensor_split)
    if isinstance(rpc_servers, str) or isinstance(devices, str):
        raise TypeError("rpc_servers and devices are lists of strings (e.g. rpc_servers=['127.0.0.1:50052'])")
    rpc_devs: list[str] = []
    for ep in rpc_servers or ():
        rpc_devs += add_rpc_server(ep)
    dev_names: list[str] | None
    if devices is not None:
        dev_names = list(devices)
    elif _registry.registered():
        # llama.cpp's default selection takes every RPC device registered in the process
        # (first); a model uses only the servers it names - the others may serve other
        # models, or be gone. Local GPUs are added as llama.cpp would.
        dev_names = rpc_devs + local_offload_devices()
    else:
        dev_names = None
    endpoints: tuple[str, ...] = ()
    if dev_names is not None:
        for n in dev_names:
            device_handle(n)  # unknown names fail here, with the known ones listed
        endpoints = tuple(dict.fromkeys(e for n in dev_names if (e := rpc_endpoint_of(n)) is not None))
    n_dev = len(dev_names) if dev_names is not None else n_offload_devices()
    if ts is not None and len(ts) > max(n_dev, 1):
        raise ValueError(
            f"tensor_split has {len(ts)} entries but only {max(n_dev, 1)} device(s) can hold layers"
            + (f" ({', '.join(dev_names)}; the CPU is not one of them)" if dev_names else "")
        )
    if main_gpu < 0 or (n_dev and main_gpu >= max(n_dev, 1)):
        raise ValueError(f"main_gpu={main_gpu} out of range for {max(n_dev, 1)} device(s)")
    for ep in endpoints:
        # ggml-rpc aborts the process when it cannot connect, and waits forever on a server
        # busy with another client: check each server answers before llama.cpp talks to it
        ok, why = _rpc.endpoint_usable(ep)
        if not ok:
            raise RpcConnectionError(ep, f"cannot be used: {why}")
    return Placement(split_mode=split_mode, main_gpu=int(main_gpu), devices=dev_names, tensor_split=ts,
                     rpc_endpoints=endpoints)
