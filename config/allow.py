"""Allow-lists for outbound requests: which non-public hosts webhooks may be sent to
(WHISPERQ_WEBHOOK_ALLOW) and audio may be fetched from (WHISPERQ_FETCH_ALLOW).

Public addresses are always allowed; these lists open particular internal ones. Each entry
is a network, an address or a host name, with an optional port:

    10.0.0.0/8            any port on that network
    10.1.2.3:8443         one port on one address
    [fd00::/8]:443        IPv6: brackets around it when a port follows
    hooks.internal:443    a URL naming exactly this host (all its addresses) on this port

Scoping an entry to the one port the receiver listens on keeps the rest of that host (its
database, its admin port) out of reach. A host-name entry trusts the operator's DNS for that
name; an address entry does not depend on DNS at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class AllowRule:
    network: Network | None
    host: str | None
    port: int | None  # None: any port
    # parse_rule gives every rule either a network or a host, never both

    def covers(self, host: str, port: int, addresses: Iterable[Address]) -> bool:
        """Whether a URL naming `host`:`port` that resolved to `addresses` (ip_address
        objects, with the IPv4 inside any IPv6 form added) is let through by this entry."""
        if self.port is not None and self.port != port:
            return False
        if self.host is not None:
            return self.host == host
        network = self.network
        if network is None:
            return False
        return any(a.version == network.version and a in network for a in addresses)

    def __str__(self) -> str:
        network = self.network
        if self.host:
            where = self.host
        elif network is not None:
            where = str(network.network_address) if network.num_addresses == 1 else str(network)
        else:
            where = ""
        if self.port is None:
            return where
        return f"[{where}]:{self.port}" if ":" in where else f"{where}:{self.port}"


def parse_rule(entry: str) -> AllowRule:
    """One entry (see the module docstring); ValueError says what is wrong with it."""
    text = entry.strip()
    port_text: str | None = None
    if text.startswith("["):  # [v6 address or network]:port
        inside, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("put an IPv6 address or network in brackets, then :PORT, such as [fd00::/8]:443")
        text, port_text = inside, rest[1:] or None
    elif text.count(":") == 1:  # host:port or v4:port (a bare IPv6 has two or more)
        text, port_text = text.split(":")
    port: int | None = None
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
        port = int(port_text)
    try:
        return AllowRule(ipaddress.ip_network(text, strict=False), None, port)
    except ValueError:
        pass
    if text.count(":") >= 2:
        raise ValueError(f"{text!r} is not an IPv6 address or network; with a port, put it in brackets: [fd00::/8]:443")
    host = text.lower().rstrip(".")
    labels = host.split(".")
    if (
        not host
        or "/" in host
        or not all(lbl and len(lbl) <= 63 and lbl.replace("-", "").isalnum() and lbl.isascii() for lbl in labels)
    ):
        raise ValueError(f"{text!r} is not a network, an address or a host name")
    if labels[-1].isdigit():
        raise ValueError(f"{text!r} is not a valid address")
    return AllowRule(None, host, port)


def parse_rules(value: str | None) -> tuple[AllowRule, ...]:
    if value is None:
        return ()
    return tuple(parse_rule(entry) for entry in value.split(",") if entry.strip())
