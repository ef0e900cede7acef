"""Where a group's clients are served: every rank's client address and load, for PONG (protocol §6.7).

A game fleet is given one address. Every rank's PONG names all the ranks (``ranks``), so a client
whose rank goes away reconnects to another; and a rank with more connected clients than another
redirects a new 1.9 client there (``redirect``), so a fleet pointed at one rank spreads over all.
The loads are each rank's connected clients as of the group's last agreement (lockstep_loop.py makes
one every few tens of milliseconds while the ranks wait for data), plus the clients this rank sent
to each rank since: a burst of new clients between two agreements is spread too, not all sent to
the rank that looked emptiest.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from tether.protocol.connection import format_address
from tether.protocol.messages import parse_version

#: Hosts that mean "every interface": no client can be told to connect to them.
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def advertised_host(bind_host: str, override: str | None, environ: dict[str, str] | None = None) -> str:
    """The host clients reach this rank at: ``override`` (--advertise-host), else the bound host, else
    (a wildcard) this node's address on the route to torchrun's MASTER_ADDR (loopback when it is local)."""
    if override:
        return override
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    env = os.environ if environ is None else environ
    master = env.get("MASTER_ADDR", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET6 if ":" in master else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, int(env.get("MASTER_PORT", "29500"))))  # (UDP: nothing is sent)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.getfqdn()


class RankDirectory:
    """This rank's view of the group's client addresses and loads."""

    def __init__(self, rank: int, addresses: list[str]) -> None:
        self.rank = rank
        #: Every rank's client address, ``"host:port"``, in rank order (PONG ``ranks``).
        self.addresses = addresses
        #: Connected clients per rank: the last agreement's, plus the redirects sent since.
        self.loads = [0.0] * len(addresses)
        #: Clients this rank redirected, per rank they were sent to.
        self.redirected = [0] * len(addresses)
        #: Connections told to move that have not closed yet: no longer this rank's load. Each with the
        #: rank it was sent to and the agreement it was counted there after.
        self._leaving: dict[int, tuple[int, int]] = {}
        #: Agreements taken so far (a redirect's estimate stands until the next one).
        self._agreements = 0
        #: Connections told to move that sent more instead (§6.7: a redirect is advice): this rank's load
        #: again, and never told to move a second time.
        self._stayed: set[int] = set()

    @classmethod
    def gather(cls, group: Any, host: str, port: int) -> "RankDirectory":
        """A collective of the group: every rank's address, learnt by every rank."""
        return cls(group.rank, [str(a) for a in group.gather_objects(format_address((host, port)))])

    def agreed(self, loads: list[float]) -> None:
        """The loads the group just agreed on (each rank's connected clients)."""
        self.loads = [float(load) for load in loads]
        self._agreements += 1

    def pong_fields(self, ping: dict[str, Any], connection: int, clients_here: int) -> dict[str, Any]:
        """What a PONG adds for a group (§7.2): ``ranks``, and ``redirect`` to the least loaded rank when
        the PING allows one (it announces 1.9 or later, so a bare heartbeat PING never gets one, and is
        not ``redirected``) and that rank serves fewer clients than this one does without the asking
        connection and those already told to move (``clients_here`` counts them all)."""
        fields: dict[str, Any] = {"ranks": list(self.addresses)}
        if (ping.get("redirected") is True or not _speaks_1_9(ping.get("protocol_version"))
                or connection in self._leaving or connection in self._stayed):
            return fields
        here = max(clients_here - 1 - len(self._leaving), 0)
        target = min((r for r in range(len(self.addresses)) if r != self.rank), key=lambda r: (self.loads[r], r),
                     default=None)
        if target is not None and self.loads[target] < here:
            self.loads[target] += 1
            self.redirected[target] += 1
            self._leaving[connection] = (target, self._agreements)
            fields["redirect"] = self.addresses[target]
        return fields

    def heard_from(self, connection: int) -> None:
        """A connection sent a body (any, before it is read). One told to move sends nothing more on it
        (§6.7): if it does, it stayed. It counts as this rank's load again, no longer as the rank it was
        sent to (unless an agreement counted the group's clients since), and is not told to move again."""
        told = self._leaving.pop(connection, None)
        if told is not None:
            target, agreements = told
            if agreements == self._agreements:
                self.loads[target] = max(self.loads[target] - 1, 0.0)
            self._stayed.add(connection)

    def left(self, connection: int) -> None:
        """A connection closed (one told to move no longer counts as leaving)."""
        self._leaving.pop(connection, None)
        self._stayed.discard(connection)


def _speaks_1_9(version: Any) -> bool:
    try:
        return isinstance(version, str) and parse_version(version) >= (1, 9)
    except ValueError:
        return False
