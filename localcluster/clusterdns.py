"""The cluster DNS of the real node's pods: CoreDNS as a host process, on a ClusterIP of the host's loopback.

A kubelet gives every pod a resolv.conf naming the cluster DNS (its `clusterDNS`), with the search
path `<namespace>.svc.cluster.local svc.cluster.local cluster.local`. Without one (the host's
resolv.conf, nameserver 10.255.255.53 here) a pod cannot resolve a Service or a pod of a headless
Service: JobSet's pods find node 0 by such a name (`<jobset>-node-0-0.<jobset>`), so a multi-node
TrainJob needs it (issue 24, stage 3.2).

`with ClusterDns(cp) as dns:` reserves DNS_IP (the 10th address of the service CIDR, as kubeadm
picks) by creating the `kube-dns` Service in kube-system with that clusterIP, so the API server
never hands it to another Service; puts the address on the host's loopback (as clusterip.py does,
there is no kube-proxy); and runs the pinned CoreDNS listening there on port 53 with the Corefile
kubeadm ships, less what a host process cannot use:

- `kubernetes cluster.local in-addr.arpa ip6.arpa` with `kubeconfig` (the admin identity; the
  plugin's `endpoint` is ignored when a kubeconfig is given, whose server address wins) and
  `pods insecure`, and `ttl 5` (kubeadm's is 30): a name asked for before its pod has an address
  is answered NXDOMAIN, and that answer is cached for the TTL, which JobSet's node 1 would wait out;
- `forward . /etc/resolv.conf` (the host's resolver for every other name) and `cache 30`;
- `ready` and `health` on free ports of 127.0.0.1: start() waits until CoreDNS reports ready
  (the kubernetes plugin has synced with the API server).

Pass `dns.ip` to `RealNode(cp, cluster_dns=dns.ip)`. A pod's packet to DNS_IP goes through its
default route (the node's bridge) and is delivered locally by the host.
"""

from __future__ import annotations

import ipaddress
import json
import pathlib
import subprocess
import time
import urllib.request

from localcluster import gobuild, procs, reaper
from localcluster.clusterip import _on_loopback
from localcluster.controlplane import SERVICE_CIDR

CLUSTER_DOMAIN = "cluster.local"
#: kubeadm's choice: the 10th address of the service CIDR (10.96.0.10 in kubeadm's default range).
DNS_IP = str(ipaddress.ip_network(SERVICE_CIDR)[10])
_START_TIMEOUT_S = 120.0


def kube_dns_service(ip: str) -> dict:
    """The `kube-dns` Service a kubeadm cluster has, with `ip` as its fixed clusterIP (a reservation here:
    no pod backs it, CoreDNS listens on the host)."""
    ports = [
        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"clusterIP": ip, "selector": {"k8s-app": "kube-dns"}, "ports": ports},
    }


def corefile(ip: str, kubeconfig: pathlib.Path, ready_port: int, health_port: int) -> str:
    return f""".:53 {{
    bind {ip}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 30
}}
"""


class ClusterDns:
    """CoreDNS for `cp`'s cluster, at `ip`:53 on the host's loopback; a context manager."""

    def __init__(self, cp, ip: str = DNS_IP):
        if ipaddress.ip_address(ip) not in ipaddress.ip_network(SERVICE_CIDR):
            raise ValueError(f"cluster DNS address {ip} is outside the service CIDR {SERVICE_CIDR}")
        self.cp, self.ip = cp, ip
        self.dir = reaper.temporary_dir("c10dns-")
        self.proc: procs.Process | None = None
        self._added_ip = False
        self.started_in_s: float | None = None

    def __enter__(self) -> ClusterDns:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        binary = gobuild.ensure_binary("coredns")
        self._reserve_ip()
        if not _on_loopback(self.ip):
            subprocess.run(
                ["ip", "addr", "add", f"{self.ip}/32", "dev", "lo"],
                capture_output=True,
                text=True,
                check=True,
            )
            reaper.track_command(self._undo_ip)
            self._added_ip = True
        ready_port, health_port = procs.free_port(), procs.free_port()
        path = self.dir / "Corefile"
        path.write_text(corefile(self.ip, self.cp.kubeconfig, ready_port, health_port))
        self.proc = procs.Process("coredns", [str(binary), "-conf", str(path)], self.dir / "logs")
        procs.wait_for(
            "CoreDNS ready",
            lambda: _http_ok(f"http://127.0.0.1:{ready_port}/ready"),
            _START_TIMEOUT_S,
            [self.proc],
        )
        self.started_in_s = round(time.monotonic() - started, 1)

    def _reserve_ip(self) -> None:
        found = self.cp.kubectl("get", "service", "kube-dns", "-n", "kube-system", "-o", "json")
        if found.returncode == 0:
            have = json.loads(found.stdout)["spec"].get("clusterIP")
            if have != self.ip:
                raise RuntimeError(f"kube-system/kube-dns already has clusterIP {have}, not {self.ip}")
            return
        # Refused ("provided IP is already allocated") when another Service holds the address.
        self.cp.kubectl_ok("create", "-f", "-", input=json.dumps(kube_dns_service(self.ip)))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self._added_ip:
            subprocess.run(self._undo_ip, capture_output=True)
            reaper.untrack("command", self._undo_ip)
            self._added_ip = False
        # The Service stays: the address is reserved for the control plane's lifetime.
        reaper.remove_dir(self.dir)

    @property
    def _undo_ip(self) -> list[str]:
        return ["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
