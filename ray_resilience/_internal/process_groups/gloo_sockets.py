"""Finding and shutting down gloo's TCP connections from /proc (Linux only).

A gloo connection: a non-listening TCP socket in an epoll set that also holds a listening socket
created after the pre-init snapshot, not on a store port, and no socket from before it. Why the
selection must be exact: docs/design.md, section 5.
"""

from __future__ import annotations

import dataclasses
import os
import socket

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"
_SOCKET_LINK_PREFIX = "socket:["


@dataclasses.dataclass(frozen=True, kw_only=True)
class TcpSocket:
    """One TCP socket of this process, as seen in /proc."""

    fd: int
    """Descriptor number in this process (owned by whoever opened it, never by us)."""
    inode: int
    """Socket inode; stable identity (fd numbers are reused)."""
    local: str
    """Local address as "ip:port"."""
    remote: str
    """Remote address as "ip:port" ("0.0.0.0:0" for listeners)."""
    local_port: int
    remote_port: int
    listening: bool


def _decode_address(hex_addr: str) -> tuple[str, int]:
    """Decodes /proc/net/tcp's "0100007F:1F90" (each 32-bit word in host byte order)."""
    addr_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(addr_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    ip = socket.inet_ntop(family, words)
    if ip.startswith("::ffff:") and "." in ip:
        ip = ip[len("::ffff:"):]
    return ip, int(port_hex, 16)


def _tcp_table() -> dict[int, tuple[str, int, str, int, bool]]:
    """Maps socket inode -> (local ip, local port, remote ip, remote port, listening)."""
    table: dict[int, tuple[str, int, str, int, bool]] = {}
    for path in _TCP_TABLES:
        try:
            with open(path) as fh:
                lines = fh.readlines()[1:]
        except OSError:  # no IPv6 in this kernel / namespace
            continue
        for line in lines:
            fields = line.split()
            local_ip, local_port = _decode_address(fields[1])
            remote_ip, remote_port = _decode_address(fields[2])
            table[int(fields[9])] = (local_ip, local_port, remote_ip, remote_port,
                                     fields[3] == _TCP_LISTEN)
    return table


def _fd_links() -> dict[int, str]:
    """This process's descriptors and what they point to (racy by nature: fds come and go)."""
    links: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return links


def tcp_sockets() -> dict[int, TcpSocket]:
    """All TCP sockets this process holds now, by descriptor."""
    table = _tcp_table()
    found: dict[int, TcpSocket] = {}
    for fd, link in _fd_links().items():
        if not link.startswith(_SOCKET_LINK_PREFIX):
            continue
        inode = int(link[len(_SOCKET_LINK_PREFIX):-1])
        if inode not in table:  # a unix or UDP socket
            continue
        lip, lport, rip, rport, listening = table[inode]
        found[fd] = TcpSocket(fd=fd, inode=inode, local=f"{lip}:{lport}", remote=f"{rip}:{rport}",
                              local_port=lport, remote_port=rport, listening=listening)
    return found


def socket_inodes() -> frozenset[int]:
    """Inodes of every socket (any family) open now: the snapshot taken before gloo starts."""
    return frozenset(int(link[len(_SOCKET_LINK_PREFIX):-1]) for link in _fd_links().values()
                     if link.startswith(_SOCKET_LINK_PREFIX))


def _epoll_targets(epoll_fd: int) -> list[int]:
    """Descriptors registered in an epoll set ("tfd:" lines of its fdinfo)."""
    try:
        with open(f"/proc/self/fdinfo/{epoll_fd}") as fh:
            return [int(line.split()[1]) for line in fh if line.startswith("tfd:")]
    except (OSError, ValueError, IndexError):
        return []


def _epoll_sets() -> list[list[int]]:
    return [_epoll_targets(fd) for fd, link in _fd_links().items()
            if link == "anon_inode:[eventpoll]"]


def find_gloo_sockets(baseline: frozenset[int], store_ports: frozenset[int]) -> list[TcpSocket]:
    """gloo's peer connections. ``baseline``: ``socket_inodes()`` before the first group;
    ``store_ports``: every TCPStore's port (their sockets are never returned)."""
    sockets = tcp_sockets()
    found: list[TcpSocket] = []
    for targets in _epoll_sets():
        members = [sockets[fd] for fd in targets if fd in sockets]
        if any(s.inode in baseline for s in members):
            continue
        if not any(s.listening and s.local_port not in store_ports for s in members):
            continue
        found.extend(s for s in members if not s.listening
                     and s.local_port not in store_ports and s.remote_port not in store_ports)
    return found


def find_store_client_sockets(baseline: frozenset[int], store_ports: frozenset[int]
                              ) -> list[TcpSocket]:
    """This process's connections to a TCPStore opened since the snapshot (never server sides)."""
    return [s for s in tcp_sockets().values() if not s.listening and s.inode not in baseline
            and s.remote_port in store_ports and s.local_port not in store_ports]


def shutdown_socket(sock: TcpSocket) -> bool:
    """``shutdown(SHUT_RDWR)`` on someone else's socket, through a duplicate descriptor, after
    checking the inode (the number may be reused); False when the socket is gone."""
    try:
        dup = os.dup(sock.fd)
    except OSError:
        return False
    try:
        same = os.fstat(dup).st_ino == sock.inode
    except OSError:
        same = False
    if not same:
        os.close(dup)
        return False
    with socket.socket(fileno=dup) as handle:  # owns (and closes) the duplicate only
        try:
            handle.shutdown(socket.SHUT_RDWR)
        except OSError:  # ENOTCONN: the peer already went away, nothing left to unblock
            return False
    return True
