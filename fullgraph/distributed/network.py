"""Which network interface a rank uses, which address rank 0 publishes, and who still answers.

On a cluster the host name often resolves to a loopback address (Debian's ``127.0.1.1 host``,
containers' ``127.0.0.1 host``); gloo binds the address the host name resolves to, so its peers
on other nodes are told to connect to their own loopback and the full mesh never forms (the
``connectFullMesh ... Connection refused, remote=[127.0.0.1]`` of DGL #7292). Here:

- :func:`interface_for` asks the kernel which local address routes to an address (a UDP
  socket's ``connect`` picks the route and sends nothing) and names the interface holding it;
- :func:`use_interface_for` sets ``GLOO_SOCKET_IFNAME`` to it unless the user set it;
- :func:`rendezvous_address` is rank 0's choice of the address it publishes under an MPI
  launcher: one every rank reaches directly (on one of its subnets, or its own address);
- :class:`PeerProbe`: every rank keeps a listening socket open (the kernel completes a TCP
  handshake without the process calling ``accept``), so that after a collective timed out a
  rank can tell which peers still answer: ``refused`` (host up, process gone) or ``no answer``
  (host or link down).

IPv4 only; interfaces and their first addresses come from ``ioctl`` (Linux), with no other
dependency.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import select
import socket
import struct
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x891B
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


@dataclass(frozen=True)
class Interface:
    """One IPv4 interface of this host (its first address).

    Attributes:
        name: the interface name (``eth0``, ``ib0``, ``lo``).
        address: its IPv4 address, dotted.
        prefixlen: the length of its network prefix (24 for a /24).
        loopback: whether it is a loopback interface.
    """

    name: str
    address: str
    prefixlen: int
    loopback: bool

    def reaches(self, address: str) -> bool:
        """Whether ``address`` lies on this interface's own subnet (no router in between)."""
        net = ipaddress.ip_interface(f"{self.address}/{self.prefixlen}").network
        return ipaddress.ip_address(address) in net


def _ioctl(sock: socket.socket, request: int, name: str) -> bytes:
    return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))


def interfaces() -> list[Interface]:
    """The IPv4 interfaces of this host (network namespace) that are up, in index order."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                flags = struct.unpack("H", _ioctl(s, _SIOCGIFFLAGS, name)[16:18])[0]
                addr = socket.inet_ntoa(_ioctl(s, _SIOCGIFADDR, name)[20:24])
                mask = _ioctl(s, _SIOCGIFNETMASK, name)[20:24]
            except OSError:  # no IPv4 address
                continue
            if flags & _IFF_UP:
                prefix = bin(int.from_bytes(mask, "big")).count("1")
                out.append(Interface(name, addr, prefix, bool(flags & _IFF_LOOPBACK)))
    return out


def resolve(host: str) -> str | None:
    """The first IPv4 address of ``host`` (a name or an address), or ``None``."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def source_address(host: str) -> str | None:
    """The local address the kernel would send from to reach ``host`` (nothing is sent)."""
    address = resolve(host)
    if address is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))
            return str(s.getsockname()[0])
        except OSError:  # no route
            return None


def interface_for(host: str, local: Sequence[Interface] | None = None) -> Interface | None:
    """The interface holding the address that routes to ``host``, or ``None`` (no route, or
    a source address that is not an interface's first address)."""
    src = source_address(host)
    if src is None:
        return None
    for iface in interfaces() if local is None else local:
        if iface.address == src:
            return iface
    return None


def use_interface_for(host: str, env: MutableMapping[str, str] | None = None) -> str | None:
    """Point gloo at the interface that routes to ``host`` unless ``GLOO_SOCKET_IFNAME`` is set.

    Args:
        host: the rendezvous address (``MASTER_ADDR``, or rank 0's published address).
        env: the environment to read and update (default ``os.environ``, which torch reads
            when it creates the gloo device).

    Returns:
        The interface gloo will use (the user's setting when given), or ``None`` when none was
        found (gloo then falls back to its own choice: the host name's address).
    """
    env = os.environ if env is None else env
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"]
    iface = interface_for(host)
    if iface is None:
        return None
    env["GLOO_SOCKET_IFNAME"] = iface.name
    return iface.name


def wait_for_listener(host: str, port: int, deadline: float) -> str | None:
    """Try to connect to ``host:port`` until it accepts or ``time.monotonic()`` passes
    ``deadline``; ``None`` once it accepted, else the last error (one line).

    The store's own client retries with timeouts of its own (well past the deadline) and logs
    every try; waiting here first keeps the set-up inside the deadline, and quiet.
    """
    error = "not tried"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return error
        try:
            with socket.create_connection((host, port), timeout=min(2.0, left)):
                return None
        except OSError as exc:
            error = exc.strerror or str(exc) or type(exc).__name__
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def rendezvous_address(
    per_rank: Sequence[Sequence[Interface]], hostname_address: str | None = None
) -> str:
    """The address rank 0 publishes for the rendezvous of an MPI-launched job.

    Args:
        per_rank: every rank's interfaces (rank 0's first), as :func:`interfaces` lists them.
        hostname_address: what rank 0's host name resolves to, tried first when it is one of
            rank 0's non-loopback addresses.

    Returns:
        ``127.0.0.1`` when every rank is on rank 0's host (the same addresses); else the first
        of rank 0's non-loopback addresses (host name's first) that every rank holds itself or
        finds on one of its subnets; else the first such address anyway (a routed network).
    """
    mine = [i for i in per_rank[0] if not i.loopback]
    same_host = {i.address for i in mine}
    hosts = [[i for i in r if not i.loopback] for r in per_rank]
    if all({i.address for i in r} == same_host for r in hosts):
        return "127.0.0.1"
    candidates = sorted(mine, key=lambda i: i.address != hostname_address)

    def reached_by(r: list[Interface], address: str) -> bool:
        # Rank 0's host itself, or a host with this subnet whose own addresses do not include
        # it (every docker host has 172.17.0.1: that address leads each host to itself).
        own = {i.address for i in r}
        return own == same_host or (address not in own and any(i.reaches(address) for i in r))

    for c in candidates:
        if all(reached_by(r, c.address) for r in hosts):
            return c.address
    return candidates[0].address if candidates else "127.0.0.1"


def reachable_address(peer: Sequence[Interface], local: Sequence[Interface]) -> str:
    """The address of ``peer``'s host that this host reaches directly (loopback when it is
    this host; else one on a shared subnet; else the peer's first non-loopback address)."""
    theirs = [i for i in peer if not i.loopback]
    ours = {i.address for i in local if not i.loopback}
    if {i.address for i in theirs} == ours:
        return "127.0.0.1"
    for i in theirs:
        if i.address not in ours and any(m.reaches(i.address) for m in local if not m.loopback):
            return i.address
    return theirs[0].address if theirs else "127.0.0.1"


class PeerProbe:
    """A listening socket of this rank, and connection probes of the other ranks' sockets.

    Build it on every rank, exchange :attr:`endpoint` (all-gather), hand the list to
    :meth:`set_peers`; :meth:`unreachable` then says which peers do not answer.

    Args:
        backlog: pending connections the kernel accepts for us (probes are closed at once).
    """

    def __init__(self, backlog: int = 128) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(backlog)
        self.port = int(self._sock.getsockname()[1])
        self.interfaces = interfaces()
        self.host = socket.gethostname()
        self._peers: dict[int, tuple[str, int]] = {}
        self._hosts: dict[int, str] = {}

    @property
    def endpoint(self) -> tuple[list[Interface], int, str]:
        """What the peers need to probe this rank: its interfaces and port (and its host name,
        which names the node in messages)."""
        return self.interfaces, self.port, self.host

    def set_peers(self, endpoints: Sequence[tuple[list[Interface], int, str]], rank: int) -> None:
        """Record every rank's endpoint (from an all-gather); this rank's own is skipped."""
        self._peers = {
            r: (reachable_address(e[0], self.interfaces), e[1])
            for r, e in enumerate(endpoints)
            if r != rank
        }
        self._hosts = {r: e[2] for r, e in enumerate(endpoints) if r != rank and len(e) > 2}

    def node_of(self, rank: int) -> str | None:
        """The host name of ``rank`` when it is another host's than this rank's, else ``None``."""
        host = self._hosts.get(rank)
        return host if host and host != self.host else None

    def address_of(self, rank: int) -> str | None:
        """The address this rank probes ``rank`` at, if known."""
        return self._peers[rank][0] if rank in self._peers else None

    def unreachable(self, timeout_s: float = 3.0) -> dict[int, str]:
        """Peers that do not answer a TCP connection within ``timeout_s``: rank -> why.

        All peers are probed at once (non-blocking connects), so the call lasts at most
        ``timeout_s``. Drained connections are accepted and closed on the way.
        """
        self._drain()
        pending: dict[socket.socket, int] = {}
        result: dict[int, str] = {}
        for rank, (host, port) in sorted(self._peers.items()):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            code = s.connect_ex((host, port))
            if code == 0:
                s.close()
            elif code in (errno.EINPROGRESS, errno.EALREADY, errno.EAGAIN):
                pending[s] = rank
            else:
                result[rank] = os.strerror(code).lower()
                s.close()
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _, writable, _ = select.select([], list(pending), [], left)
            for s in writable:
                rank = pending.pop(s)
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    result[rank] = os.strerror(err).lower()
                s.close()
        for s, rank in pending.items():
            result[rank] = f"no answer within {timeout_s:g} s"
            s.close()
        return dict(sorted(result.items()))

    def _drain(self) -> None:
        """Accept and close the probes other ranks made of us (keeps the backlog free)."""
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._sock.accept()
                conn.close()

    def close(self) -> None:
        """Stop listening."""
        self._sock.close()


def describe_unreachable(
    unreachable: Mapping[int, str], probe: PeerProbe | None, size: int, rank: int
) -> str:
    """``rank 2 (host node7, 10.77.0.2: no answer within 3 s), rank 3 (...)`` (the host
    named when it is another's than this rank's), or what answered."""
    if probe is None:
        return "peers not probed"
    if not unreachable:
        return f"every other rank of {size} still answers a connection (a peer may be stalled)"
    parts = []
    for r, why in unreachable.items():
        node = probe.node_of(r)
        parts.append(f"rank {r} ({f'host {node}, ' if node else ''}{probe.address_of(r)}: {why})")
    return "unreachable: " + ", ".join(parts)
