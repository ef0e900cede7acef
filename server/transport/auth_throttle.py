"""Wrong auth tokens per address: an address that keeps guessing the token has its
connections refused for a while (AUTH_THROTTLED), on every transport alike."""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from typing import Any

#: Wrong auth tokens of one address are counted over this many seconds.
AUTH_FAILURE_WINDOW_S = 60.0
#: The first refusal of an address after wrong tokens lasts this long; each next one twice as long.
AUTH_FIRST_BACKOFF_S = 1.0
#: Addresses whose wrong tokens are remembered at once (the least recently seen is forgotten first).
AUTH_THROTTLE_ADDRESSES = 4096


def peer_address(peer: Any) -> str | None:
    """The address a peer's wrong tokens are counted under: its IPv4 address, or its IPv6
    /64 network (one host usually holds a whole /64); None when the peer has no IP address."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    try:
        ip = ipaddress.ip_address(peer[0].split("%", 1)[0])
    except ValueError:
        return peer[0]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _AddressRecord:
    __slots__ = ("failures", "blocked_until", "backoff", "last")

    def __init__(self) -> None:
        self.failures: deque[float] = deque()  # times of wrong tokens not yet answered by a refusal
        self.blocked_until = 0.0
        self.backoff = 0.0  # length of the last refusal period (0: none yet)
        self.last = 0.0  # the latest wrong token or the end of the refusal period, whichever is later


class AuthThrottle:
    """Wrong auth tokens per address, and how long an address is refused for them.

    ``max_failures`` wrong tokens within ``window_s`` start a refusal period of
    ``first_backoff_s``; after it, each further wrong token starts one twice as long
    as the last, up to ``max_backoff_s``. An address quiet for ``window_s`` after its
    last wrong token (or refusal period) starts afresh. At most ``max_addresses`` are
    remembered; the least recently seen is forgotten first. Every client behind one
    address (one host, one NAT) shares its record.
    """

    def __init__(self, max_failures: int = 5, max_backoff_s: float = 60.0, window_s: float = AUTH_FAILURE_WINDOW_S,
                 first_backoff_s: float = AUTH_FIRST_BACKOFF_S, max_addresses: int = AUTH_THROTTLE_ADDRESSES) -> None:
        self.max_failures = max_failures
        self.max_backoff_s = max_backoff_s
        self.window_s = window_s
        self.first_backoff_s = min(first_backoff_s, max_backoff_s)
        self.max_addresses = max_addresses
        self._records: OrderedDict[str, _AddressRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def _record(self, address: str, now: float) -> _AddressRecord | None:
        record = self._records.get(address)
        if record is not None and now - record.last >= self.window_s:
            del self._records[address]  # quiet long enough: forgiven
            return None
        return record

    def refused_for(self, address: str | None, now: float) -> float:
        """Seconds for which connections from ``address`` are still refused (0: none)."""
        if address is None:
            return 0.0
        record = self._record(address, now)
        if record is None or record.blocked_until <= now:
            return 0.0
        self._records.move_to_end(address)
        return record.blocked_until - now

    def failed(self, address: str | None, now: float) -> float:
        """Count a wrong token from ``address``; returns the refusal period it starts (0: none)."""
        if address is None:
            return 0.0
        record = self._record(address, now)
        if record is None:
            record = self._records[address] = _AddressRecord()
            while len(self._records) > self.max_addresses:
                self._records.popitem(last=False)
        self._records.move_to_end(address)
        record.last = max(record.last, now)
        if record.blocked_until > now:  # (a guess sent before the period began): it does not extend it
            return 0.0
        record.failures.append(now)
        while record.failures and now - record.failures[0] >= self.window_s:
            record.failures.popleft()
        if record.backoff == 0.0 and len(record.failures) < self.max_failures:
            return 0.0
        record.failures.clear()
        record.backoff = (min(self.max_backoff_s, record.backoff * 2) if record.backoff
                          else self.first_backoff_s)
        record.blocked_until = now + record.backoff
        record.last = record.blocked_until
        return record.backoff
