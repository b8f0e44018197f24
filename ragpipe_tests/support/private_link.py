"""A private network link for one test process: a network namespace joined to this machine by a
veth pair, and nothing else.

``PrivateLink.create()`` makes the namespace (``ip netns add``, iproute2), a veth pair with one end
in it, a /30 between the ends (``host_ip`` here, ``peer_ip`` there) and no other route: a process
started with ``exec_prefix()`` sees only its loopback and the link, so every byte it exchanges with
the services — which then listen on ``host_ip`` — crosses the link, and the link's byte counters
and the namespace's sockets say so. It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN);
``PrivateLinkUnavailable`` says why not. ``close()`` deletes the pair and the namespace.
``private_link_here()`` is what tests call: under CI (root, iproute2) a link must be made. A test
process killed outright leaves its namespace behind (``ip netns del ragpipe-…`` removes it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

import pytest


class PrivateLinkUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise PrivateLinkUnavailable(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


@dataclass(frozen=True)
class PrivateLink:
    namespace: str
    host_if: str  # the end on this machine
    peer_if: str  # the end inside the namespace
    host_ip: str
    peer_ip: str
    network: str  # the /30 holding both ends

    @classmethod
    def create(cls) -> PrivateLink:
        if shutil.which("ip") is None:
            raise PrivateLinkUnavailable("no `ip` command: apt-get install iproute2")
        if os.geteuid() != 0:
            raise PrivateLinkUnavailable("network namespaces need root")
        tag = secrets.token_hex(3)  # interface names stay under Linux's 15 characters
        third, fourth = secrets.randbelow(256), 4 * secrets.randbelow(64)
        base = f"10.231.{third}"
        link = cls(
            namespace=f"ragpipe-{tag}",
            host_if=f"rp{tag}h",
            peer_if=f"rp{tag}p",
            host_ip=f"{base}.{fourth + 1}",
            peer_ip=f"{base}.{fourth + 2}",
            network=f"{base}.{fourth}/30",
        )
        try:
            _ip("netns", "add", link.namespace)
            _ip("link", "add", link.host_if, "type", "veth", "peer", "name", link.peer_if)
            _ip("link", "set", link.peer_if, "netns", link.namespace)
            _ip("addr", "add", f"{link.host_ip}/30", "dev", link.host_if)
            _ip("link", "set", link.host_if, "up")
            inside = ("netns", "exec", link.namespace, "ip")
            _ip(*inside, "addr", "add", f"{link.peer_ip}/30", "dev", link.peer_if)
            _ip(*inside, "link", "set", link.peer_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            link.close()
            raise
        return link

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def interfaces(self) -> list[str]:
        """The namespace's interfaces that hold an address, by name (the kernel may add idle tunnel
        fallback devices, ``sit0`` and the like, to every namespace: they carry nothing)."""
        found = json.loads(_ip("-j", "-n", self.namespace, "addr", "show"))
        return sorted(entry["ifname"] for entry in found if entry.get("addr_info"))

    def routes(self) -> list[str]:
        """The namespace's routes (IPv4 and IPv6), by destination."""
        found = json.loads(_ip("-j", "-n", self.namespace, "route", "show"))
        found += json.loads(_ip("-j", "-6", "-n", self.namespace, "route", "show"))
        return sorted(entry["dst"] for entry in found)

    def peers(self) -> list[str]:
        """The remote addresses of the namespace's established TCP connections."""
        out = subprocess.run(
            [*self.exec_prefix(), "ss", "-Htn", "state", "established"], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise PrivateLinkUnavailable(f"ss in {self.namespace}: {out.stderr.strip()}")
        return [line.split()[-1].rsplit(":", 1)[0] for line in out.stdout.splitlines() if line.strip()]

    def bytes_carried(self) -> int:
        """Bytes the link has carried both ways, from this end's kernel counters."""
        stats = f"/sys/class/net/{self.host_if}/statistics"
        with open(f"{stats}/rx_bytes") as rx, open(f"{stats}/tx_bytes") as tx:
            return int(rx.read()) + int(tx.read())

    def close(self) -> None:
        # deleting one end of a veth pair deletes both; each step is idempotent for a half-made link
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)


def private_link_here() -> tuple[PrivateLink | None, str]:
    """A new link, or — outside CI only — None and why this machine cannot make one."""
    try:
        return PrivateLink.create(), ""
    except PrivateLinkUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root with iproute2 and must make a network namespace: {exc}")
        return None, str(exc)
