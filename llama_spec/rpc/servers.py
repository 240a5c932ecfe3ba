"""Local ``ggml-rpc-server`` processes: the packaged binary, free loopback ports, start and stop.

For tests and for trying a split on one machine; the CLI's ``llama-spec rpc-server`` runs the
same binary. *Security*: the RPC protocol is unauthenticated - :func:`is_loopback` is the one
rule for when to warn.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RpcConnectionError
from .protocol import wait_until_ready

log = logging.getLogger("llama_spec.rpc")

UNSAFE_HOST_WARNING = ("the RPC protocol is unauthenticated; binding {host} exposes this machine to whoever "
                       "can reach the port. Never face an untrusted network.")


def rpc_server_binary() -> Path:
    """The ``ggml-rpc-server`` built with this package (FileNotFoundError when it was not)."""
    p = Path(__file__).resolve().parent.parent / "_lib" / "ggml-rpc-server"
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing (the package was built without the RPC server)")
    return p


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): the safe binds."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class RpcServer:
    """A running local ``ggml-rpc-server`` process."""

    endpoint: str
    proc: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """What the server printed so far (when started with a log file)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a crash would (no goodbye on the socket beyond the kernel's)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_rpc_server(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    threads: int = 1,
    device: str | None = None,
    ready_timeout: float = 30.0,
    log_path: str | os.PathLike[str] | None = None,
    die_with_parent: bool = True,
) -> RpcServer:
    """Start ``ggml-rpc-server -H host -p port`` and wait until it answers the handshake.

    `port` None picks a free one (retrying if another process takes it first). Binding to a
    non-loopback `host` exposes this machine to whoever can reach the port (see module doc).
    `die_with_parent` (Linux): the server gets SIGTERM when the thread that started it ends -
    also when this process is killed or aborts - so no server outlives its test.
    """
    if not is_loopback(host):
        log.warning("rpc-server: %s", UNSAFE_HOST_WARNING.format(host=host))
    for attempt in range(5):
        p = port if port is not None else free_port(host if host != "localhost" else "127.0.0.1")
        args = [str(rpc_server_binary()), "-H", host, "-p", str(p), "-t", str(int(threads))]
        if device:
            args += ["-d", device]
        out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent if die_with_parent else None)
        finally:
            if log_path is not None and not isinstance(out, int):
                out.close()
        server = RpcServer(f"{host}:{p}", proc, Path(log_path) if log_path is not None else None)
        try:
            wait_until_ready(server.endpoint, ready_timeout, proc=proc)
            return server
        except RpcConnectionError:
            server.stop()
            if port is not None or attempt == 4 or proc.returncode == 0:
                raise
            # most likely the free port was taken in between: try another one
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def local_rpc_servers(
    n: int, *, threads: int = 1, host: str = "127.0.0.1", ready_timeout: float = 30.0,
    log_dir: str | os.PathLike[str] | None = None,
) -> Iterator[list[str]]:
    """Start `n` rpc-servers on free ports of `host`; yield their "host:port" endpoints.

    Every server answers the RPC handshake before the body runs, and all are stopped on exit
    (SIGTERM, then SIGKILL). Use :func:`local_rpc_server_handles` for the processes.
    """
    with local_rpc_server_handles(n, threads=threads, host=host, ready_timeout=ready_timeout,
                                  log_dir=log_dir) as servers:
        yield [s.endpoint for s in servers]


@contextlib.contextmanager
def local_rpc_server_handles(
    n: int, *, threads: int = 1, host: str = "127.0.0.1", ready_timeout: float = 30.0,
    log_dir: str | os.PathLike[str] | None = None,
) -> Iterator[list[RpcServer]]:
    """Like :func:`local_rpc_servers`, yielding :class:`RpcServer` handles (to kill one, say)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    servers: list[RpcServer] = []
    try:
        for i in range(n):
            lp = Path(log_dir) / f"rpc-server-{i}.log" if log_dir is not None else None
            servers.append(start_rpc_server(host=host, threads=threads, ready_timeout=ready_timeout, log_path=lp))
        yield servers
    finally:
        for s in servers:
            s.stop()
