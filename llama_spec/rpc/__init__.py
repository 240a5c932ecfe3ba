"""llama.cpp's RPC backend from Python: local rpc-servers, endpoint probes, and lost servers.

*Security*: the RPC protocol is unauthenticated and unencrypted. Anyone who can reach an
rpc-server's port can read and write its memory buffers and run graphs on it. Bind servers to
loopback (the default here) or to a private, trusted network; never expose one to the internet.

Three parts, one module each:

* :mod:`~llama_spec.rpc.protocol` - endpoint strings, the RPC ``HELLO`` handshake with a
  timeout (:func:`probe`), and whether ggml may talk to an endpoint now (:func:`endpoint_usable`);
* :mod:`~llama_spec.rpc.servers` - :func:`local_rpc_servers` / :func:`start_rpc_server` start
  the packaged ``ggml-rpc-server`` on free loopback ports and stop it on exit;
* :mod:`~llama_spec.rpc.guard` - :func:`call_guarded`: a server lost during a call raises
  :class:`RpcConnectionError` instead of aborting the process, and every model or context on
  it is marked lost (see :mod:`llama_spec._handle`).

Registering a server's devices with ggml is :func:`llama_spec.llama.devices.add_rpc_server`.
"""

from __future__ import annotations

from ..errors import RpcConnectionError
from .guard import (
    call_guarded,
    check_endpoints,
    check_not_lost,
    free_deferred,
    install_abort_handler,
    lost_endpoints,
    registered_endpoints,
    release_unreachable,
    retire_if_unreachable,
)
from .protocol import (
    DEFAULT_TIMEOUT,
    RPC_PROTO_MAJOR_VERSION,
    RPC_PROTO_MINOR_VERSION,
    endpoint_usable,
    liveness,
    parse_endpoint,
    probe,
    wait_until_ready,
)
from .servers import (
    RpcServer,
    free_port,
    is_loopback,
    local_rpc_server_handles,
    local_rpc_servers,
    rpc_server_binary,
    start_rpc_server,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "RPC_PROTO_MAJOR_VERSION",
    "RPC_PROTO_MINOR_VERSION",
    "RpcConnectionError",
    "RpcServer",
    "call_guarded",
    "check_endpoints",
    "check_not_lost",
    "endpoint_usable",
    "free_deferred",
    "free_port",
    "install_abort_handler",
    "is_loopback",
    "liveness",
    "local_rpc_server_handles",
    "local_rpc_servers",
    "lost_endpoints",
    "parse_endpoint",
    "probe",
    "registered_endpoints",
    "release_unreachable",
    "retire_if_unreachable",
    "rpc_server_binary",
    "start_rpc_server",
    "wait_until_ready",
]
