"""Where kvscope may send requests, and which tokens it may send: the outbound allowlist.

The worker fetches whatever URL a target names, with the target's token, so a URL typed in
a browser must not reach cloud metadata or any internal service: loopback is allowed, and
beyond it only the hosts and networks an admin allows (`kvscope hosts allow`, the
`allowed_hosts` table, `KVSCOPE_ALLOWED_HOSTS`). Link-local and cloud metadata addresses
are refused always, even when allowed. Names are judged as written (no DNS lookup, so a
refusal probes nothing); `Allowlist.check_address` judges the addresses a name resolves to
at connect time, so a name that turns into a metadata address is refused too.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from planner.errors import InvalidInput, OutboundRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never contacted, whatever is allowed: link-local (every cloud's metadata service lives
# there: AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack) and the clouds' other metadata
# addresses (AWS over IPv6, GCP over IPv6, Alibaba, Oracle's legacy one).
REFUSED_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",
        "fe80::/10",
        "fd00:ec2::254/128",
        "fd20:ce::254/128",
        "100.100.100.200/32",
        "192.0.0.192/32",
    )
)
# Names of metadata services, refused as written (what they resolve to is refused anyway).
REFUSED_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
    }
)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})

# A token is read only from a variable of this prefix: the worker's environment holds other
# secrets (a cloud key, a database password) that a target must never be able to name.
TOKEN_PREFIX = "KVSCOPE_TOKEN_"

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
# Legacy IPv4 spellings getaddrinfo still accepts: 2852039166, 0xa9.0xfe.0xa9.0xfe, 169.254.43518.
_LEGACY_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def allow_hint(host: str) -> str:
    """The refusal of a host off the allowlist, and how an admin allows it."""
    return (
        f"{host} is not an allowed host: an admin can allow it with "
        f"`kvscope hosts allow {host}` or on the Targets page"
    )


def _never(host: str, what: str = "a link-local or cloud metadata address") -> str:
    return f"{host} is {what}; kvscope never contacts those, even when allowed"


_METADATA_NAME = "the name of a cloud metadata service"


def check_token_env(name: str) -> None:
    """OutboundRefused unless the variable carries the token prefix."""
    if not name.startswith(TOKEN_PREFIX) or name == TOKEN_PREFIX:
        raise OutboundRefused(
            f"token variable {name} must start with {TOKEN_PREFIX} (e.g. {TOKEN_PREFIX}PROD): "
            "the worker reads tokens only from those, so no other variable of its "
            "environment can be sent to a target"
        )


def canonical_host(host: str) -> str:
    """A host as compared: lower case, without IPv6 brackets or a trailing dot."""
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h.rstrip(".")


def parse_address(host: str) -> IPAddress | None:
    """The address a host spells, legacy IPv4 forms included; None for a name."""
    h = canonical_host(host).split("%", 1)[0]
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if _LEGACY_V4.match(h):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """The address and any IPv4 address it carries (mapped, 6to4, NAT64)."""
    out: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            out.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            out.append(ip.sixtofour)
        if ip in _NAT64:
            out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def never_contacted(ip: IPAddress) -> bool:
    """Whether an address is link-local or cloud metadata (refused always)."""
    return any(a in n for a in _embedded(ip) for n in REFUSED_NETWORKS if a.version == n.version)


def is_loopback(ip: IPAddress) -> bool:
    """Whether an address is this machine's loopback (always allowed)."""
    return any(a.is_loopback for a in _embedded(ip))


@dataclass(frozen=True)
class HostEntry:
    """One allowlist entry: a host name (`*.example.com` for its subdomains), an address or
    a network, in canonical spelling."""

    text: str
    kind: Literal["name", "suffix", "network"]
    network: IPNetwork | None = None

    def matches_name(self, host: str) -> bool:
        """Whether a host name (canonical) is this entry."""
        if self.kind == "name":
            return host == self.text
        if self.kind == "suffix":
            return host.endswith(self.text[1:])
        return False

    def matches_address(self, ip: IPAddress) -> bool:
        """Whether an address lies in this entry's network."""
        if self.network is None:
            return False
        return any(a in self.network for a in _embedded(ip) if a.version == self.network.version)


def parse_entry(text: str) -> HostEntry:
    """An allowlist entry from what a person typed; InvalidInput saying what is wrong."""
    raw = text.strip()
    if not raw:
        raise InvalidInput("give a host name, an address or a network (CIDR), e.g. 10.0.0.0/8")
    if "://" in raw or raw.count("/") > 1:
        raise InvalidInput(
            f"{raw!r} is not a host: give a host name, an address or a network, not a URL"
        )
    if "/" in raw:
        return _network_entry(raw)
    h = canonical_host(raw)
    ip = parse_address(h)
    if ip is None and h.count(":") == 1:
        raise InvalidInput(f"{raw!r}: give a host without a port (hosts are allowed on any port)")
    if ip is not None:
        if never_contacted(ip):
            raise InvalidInput(_never(raw))
        net = ipaddress.ip_network(ip)
        return HostEntry(str(ip), "network", net)
    suffix = h.startswith("*.")
    name = h[2:] if suffix else h
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise InvalidInput(
            f"{raw!r} is not a host name: letters, digits and '-' between dots "
            "(`*.example.com` allows every name under example.com)"
        )
    if suffix and len(labels) < 2:
        raise InvalidInput(f"{raw!r} is too wide: a wildcard needs a domain, e.g. *.example.com")
    if name in REFUSED_NAMES:
        raise InvalidInput(_never(raw, _METADATA_NAME))
    covered = [n for n in sorted(REFUSED_NAMES) if suffix and n.endswith("." + name)]
    if covered:
        raise InvalidInput(
            f"{raw!r} covers {covered[0]}, {_METADATA_NAME}; kvscope never contacts those: "
            "allow the hosts one by one"
        )
    return HostEntry(f"*.{name}" if suffix else name, "suffix" if suffix else "name")


def _network_entry(raw: str) -> HostEntry:
    try:
        net = ipaddress.ip_network(canonical_host(raw), strict=True)
    except ValueError as err:
        try:
            loose = ipaddress.ip_network(canonical_host(raw), strict=False)
        except ValueError:
            raise InvalidInput(
                f"{raw!r} is not a network: give one as ADDRESS/PREFIX, e.g. 10.0.0.0/8"
            ) from err
        raise InvalidInput(f"{raw!r} has host bits set: did you mean {loose}?") from err
    if any(
        net.version == n.version and net.subnet_of(n)  # type: ignore[arg-type]
        for n in REFUSED_NETWORKS
    ):
        raise InvalidInput(_never(raw))
    return HostEntry(str(net), "network", net)


@dataclass(frozen=True)
class Allowlist:
    """Loopback and the entries an admin allowed; link-local and metadata never."""

    entries: tuple[HostEntry, ...] = ()

    @classmethod
    def of(cls, texts: Iterable[str], strict: bool = True) -> Allowlist:
        """From entry texts; `strict=False` skips those that no longer parse (a stored entry
        a later kvscope refuses stays refused)."""
        entries: list[HostEntry] = []
        for text in texts:
            try:
                entries.append(parse_entry(text))
            except InvalidInput:
                if strict:
                    raise
        return cls(tuple(dict.fromkeys(entries)))

    def plus(self, *texts: str) -> Allowlist:
        """This list and more entries (those that do not parse are skipped)."""
        return Allowlist(self.entries + Allowlist.of(texts, strict=False).entries)

    def allows_name(self, host: str) -> bool:
        """Whether a host name (not an address) is allowed as written."""
        h = canonical_host(host)
        return h in LOOPBACK_NAMES or any(e.matches_name(h) for e in self.entries)

    def refusal(self, host: str) -> str | None:
        """Why a URL's host is refused, judged as written (no lookup); None when allowed."""
        h = canonical_host(host)
        if not h:
            return "a target URL needs a host"
        ip = parse_address(h)
        if ip is not None:
            if never_contacted(ip):
                return _never(host)
            if is_loopback(ip) or any(e.matches_address(ip) for e in self.entries):
                return None
            return allow_hint(host)
        if h in REFUSED_NAMES:
            return _never(host, _METADATA_NAME)
        return None if self.allows_name(h) else allow_hint(host)

    def check(self, host: str) -> None:
        """OutboundRefused unless the host is allowed as written."""
        reason = self.refusal(host)
        if reason is not None:
            raise OutboundRefused(reason)

    def check_address(self, host: str, address: str) -> None:
        """At connect time: OutboundRefused unless `host` may be reached at `address` (what
        it resolved to). Metadata and link-local never; a name allowed as written anywhere
        else; any other name only at loopback or an allowed network."""
        ip = parse_address(address)
        if ip is None:
            raise OutboundRefused(allow_hint(host))
        if never_contacted(ip):
            raise OutboundRefused(
                f"{host} is not an allowed host: it resolves to a link-local or cloud metadata "
                "address, which kvscope never contacts"
            )
        if parse_address(host) is not None or self.allows_name(host):
            return
        if not (is_loopback(ip) or any(e.matches_address(ip) for e in self.entries)):
            raise OutboundRefused(allow_hint(host))


LOOPBACK_ONLY = Allowlist()
