"""Talking to an rpc-server without ggml: endpoint strings, the HELLO handshake, liveness.

Nothing here loads llama.cpp. :func:`probe` bounds every wait, so an unreachable, busy or
foreign endpoint gives a clear :class:`RpcConnectionError` instead of ggml-rpc's ``abort()``
or an endless wait; :func:`endpoint_usable` is what callers ask before ggml touches a server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import time

from .._handle import endpoints as _registry
from ..errors import RpcConnectionError

# ggml-rpc wire protocol of the pinned llama.cpp (ggml/include/ggml-rpc.h, ggml-rpc.cpp)
RPC_PROTO_MAJOR_VERSION = 7
RPC_PROTO_MINOR_VERSION = 0
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_HELLO_RSP_SIZE = 4 + _RPC_CONN_CAPS_SIZE

DEFAULT_TIMEOUT = 5.0
_TCP_ESTABLISHED, _TCP_CLOSE_WAIT = "01", "08"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """"host:port" -> (host, port), with ggml-rpc's own rules (IPv4 / host name, last ':')."""
    if not isinstance(endpoint, str):
        raise TypeError(f"RPC endpoint must be a 'host:port' string, got {type(endpoint).__name__}")
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RPC endpoint {endpoint!r} must look like host:port (port 1-65535)")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("connection closed by the peer")
        buf += chunk
    return bytes(buf)


def probe(endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int, int]:
    """RPC handshake with `endpoint`, bounded by `timeout` seconds in all; return its version.

    Raises :class:`RpcConnectionError` when nothing listens there, when it does not answer
    in time (an rpc-server serves one client at a time: a busy one does not answer until its
    client disconnects), when it does not speak the RPC protocol, or on a version mismatch.
    """
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise RpcConnectionError(endpoint, f"is unreachable: no TCP connection within {timeout:g} s") from None
    except OSError as e:
        raise RpcConnectionError(endpoint, f"is unreachable: {e.strerror or e}") from None
    with sock:
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock.sendall(bytes([_RPC_CMD_HELLO]) + struct.pack("<Q", _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
            if size != _HELLO_RSP_SIZE:
                raise RpcConnectionError(endpoint, f"is not a compatible ggml rpc-server (HELLO reply of {size} bytes)")
            major, minor, patch = _recv_exact(sock, size)[:3]
        except TimeoutError:
            raise RpcConnectionError(
                endpoint, f"accepted the connection but did not answer the RPC handshake within {timeout:g} s "
                "(an rpc-server serves one client at a time: is another process using it?)") from None
        except OSError as e:
            raise RpcConnectionError(endpoint, f"broke off the RPC handshake ({e.strerror or e}): "
                                               "is it a ggml rpc-server?") from None
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise RpcConnectionError(
            endpoint, f"speaks RPC protocol {major}.{minor}.{patch}; this build needs "
            f"{RPC_PROTO_MAJOR_VERSION}.x with x <= {RPC_PROTO_MINOR_VERSION} (use the same llama.cpp on both ends)")
    return major, minor, patch


def wait_until_ready(endpoint: str, timeout: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Retry :func:`probe` until the server answers, `proc` exits, or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RpcConnectionError(endpoint, f"process exited with code {proc.returncode} before it was ready")
        try:
            probe(endpoint, timeout=min(2.0, max(deadline - time.monotonic(), 0.05)))
            return
        except RpcConnectionError as e:
            last = e
            time.sleep(0.05)
    raise RpcConnectionError(endpoint, f"was not ready within {timeout:g} s ({last})")


def _our_tcp_states(host: str, port: int) -> list[str]:
    """TCP states (hex, /proc/net/tcp) of this process's sockets connected to host:port."""
    try:
        addr = socket.gethostbyname(host)
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        want = f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08X}:{port:04X}"  # kernel byte order
        states = []
        with open("/proc/net/tcp") as fh:
            next(fh)
            for line in fh:
                f = line.split()
                if f[2] == want and f[9] in inodes:
                    states.append(f[3])
        return states
    except (OSError, ValueError, StopIteration):
        return []


def liveness(endpoint: str) -> tuple[bool | None, str]:
    """(False, why) if `endpoint` is certainly gone, (True, why) if certainly up, else (None, why)."""
    try:
        host, port = parse_endpoint(endpoint)
    except (TypeError, ValueError):
        return None, "bad endpoint"
    states = _our_tcp_states(host, port)
    if _TCP_CLOSE_WAIT in states:
        return False, "the server closed the connection"
    if _TCP_ESTABLISHED in states:
        return True, "connection established"
    # no open connection of ours left (reset): is anything listening there?
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True, "accepts connections"
    except ConnectionRefusedError:
        return False, "connection refused"
    except TimeoutError:
        return None, "no answer within 1 s"
    except OSError as e:
        return False, e.strerror or str(e)


def endpoint_usable(endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    """Whether ggml may talk to `endpoint` now without aborting or hanging: (ok, why).

    An open connection of this process counts as usable (an rpc-server serves one client at
    a time, so a handshake probe would wait behind it); otherwise the handshake must succeed.
    """
    why = _registry.lost_reason(endpoint)
    if why is not None:
        return False, f"lost earlier in this process ({why})"
    try:
        host, port = parse_endpoint(endpoint)
    except (TypeError, ValueError) as e:
        return False, str(e)
    states = _our_tcp_states(host, port)
    if _TCP_CLOSE_WAIT in states:
        return False, "the server closed the connection"
    if _TCP_ESTABLISHED in states:
        return True, "connected"
    try:
        probe(endpoint, timeout=timeout)
    except RpcConnectionError as e:
        return False, e.reason
    return True, "answers the handshake"
