"""Service addresses that the real node's pods can reach, without kube-proxy.

This machine has no iptables, so there is no kube-proxy, and a Service's ClusterIP leads nowhere.
For the few addresses the pods of these tests need, the address is put on the host's loopback and
a relay (relay.py) forwards it to the host process behind it. A pod sends to the address through
its default route, the node's bridge, and the host delivers the packet locally.

The one that matters is the `kubernetes` Service (10.0.0.1:443). The kubelet gives every pod
KUBERNETES_SERVICE_HOST/PORT from it, and in-cluster clients (Argo's executor, KFP's driver and
launcher) dial it. The API server's serving certificate names 10.0.0.1 (controlplane.py), so TLS
verifies through the relay as it does behind kube-proxy.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import urllib.parse

from localcluster import reaper, relay


def _on_loopback(ip: str) -> bool:
    shown = subprocess.run(
        ["ip", "-j", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=True
    )
    return any(a["local"] == ip for link in json.loads(shown.stdout) for a in link.get("addr_info", []))


class ClusterIpRelay:
    """`ip:port` on the host's loopback, relayed to `target` (host, port); `close()` undoes both."""

    def __init__(self, ip: str, port: int, target: tuple[str, int]):
        ipaddress.ip_address(ip)  # a clear error for a bad address, before anything changes
        self.ip, self.port = ip, port
        self.added = not _on_loopback(ip)
        if self.added:
            subprocess.run(
                ["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True, text=True, check=True
            )
            reaper.track_command(self._undo)
        try:
            self.relay = relay.Relay((ip, port), target)
        except OSError:
            self._remove_address()
            raise

    @property
    def _undo(self) -> list[str]:
        return ["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"]

    def _remove_address(self) -> None:
        if self.added:
            subprocess.run(self._undo, capture_output=True)
            reaper.untrack("command", self._undo)
            self.added = False

    def close(self) -> None:
        self.relay.close()
        self._remove_address()


def kubernetes_service(cp) -> ClusterIpRelay:
    """Relay the `kubernetes` Service's ClusterIP and port to the control plane's API server."""
    service = json.loads(cp.kubectl_ok("get", "service", "kubernetes", "-n", "default", "-o", "json").stdout)
    server = urllib.parse.urlsplit(cp.server)
    return ClusterIpRelay(
        service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"], (server.hostname, server.port)
    )
