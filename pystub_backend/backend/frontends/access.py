"""Who may change the server's state: the one policy both frontends ask.

State-changing calls are model load/unload and stub restarts (group "model-repository"), shared
memory register/unregister ("shared-memory"), log setting updates ("logging") and trace setting
updates ("trace"). Reading (index, status, the settings) is not state-changing.

    a state-changing call from peer P in group G is let through when
        P is a loopback address                                   (someone on the machine), or
        G is restricted (--http-restricted-api / --grpc-restricted-protocol, per frontend):
            the caller proved it knows the key; the restriction check itself refuses the rest, or
        G is opened by --allow-remote-control=G[,G...] (or `all`)
    otherwise it is refused: HTTP 403, gRPC PERMISSION_DENIED, with a text naming both ways out.

Triton has no such default (it lets any peer load a model, which runs code): a deliberate
deviation, listed in docs/triton-differences.md. Binding to 127.0.0.1 (the default) keeps remote
peers out entirely; this covers the case of an operator binding 0.0.0.0 for inference.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from pystub_backend.backend.options import OPEN_FLAG, STATE_GROUPS, Restrictions

__all__ = ["STATE_GROUPS", "AccessPolicy", "peer_address", "is_loopback", "OPEN_FLAG", "INTERNAL_PEER"]

# With --frontend-workers the workers proxy requests to the core over a private unix socket and
# name the client's real address in this header (gRPC: metadata). The core believes it ONLY on that
# socket (a listener built with `trust_internal_peer`); on a public port it means nothing.
INTERNAL_PEER = "x-pystub-internal-peer"


def peer_address(peer: str) -> str:
    """The IP address of a peer as the frontends see it: aiohttp's `request.remote` ("1.2.3.4",
    "::1", "fe80::1%eth0") or grpc's `context.peer()` ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678",
    "unix:/path"). Anything else comes back unchanged (and is then not loopback)."""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        host = peer[5:].rsplit(":", 1)[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return peer


def is_loopback(peer: str) -> bool:
    """Whether the peer address is a loopback address (IPv4, IPv6, or IPv4-mapped IPv6)."""
    text = peer_address(peer).split("%", 1)[0]  # an IPv6 zone index is not part of the address
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    # A dual-stack listener (--http-address=::) sees 127.0.0.1 as ::ffff:127.0.0.1.
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@dataclass(frozen=True)
class AccessPolicy:
    """The policy of one frontend: its restricted groups and the groups opened to every peer."""

    restrictions: Restrictions
    opened: frozenset[str] = frozenset()

    @classmethod
    def of(cls, restrictions: Restrictions | None, opened: Iterable[str] = ()) -> AccessPolicy:
        return cls(dict(restrictions or {}), frozenset(opened))

    def refusal(self, group: str, peer: str) -> str | None:
        """Why a state-changing call of `group` from `peer` is refused, None when it is allowed."""
        if group not in STATE_GROUPS or group in self.opened or group in self.restrictions or is_loopback(peer):
            return None
        shown = peer_address(peer) or "an unknown peer"
        return (f"calls that change the server's state ({group}) are accepted from loopback only, not from "
                f"'{shown}': protect the group with a key (--http-restricted-api / --grpc-restricted-protocol) "
                f"or open it with {OPEN_FLAG}={group}")
