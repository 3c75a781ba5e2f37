"""A real Kubernetes node on this machine: containerd + runc + the CNI bridge, and a kubelet that
registers with a ControlPlane (controlplane.py) and runs real containers.

`with RealNode(cp) as node:` builds (once, cached by gobuild) and starts containerd, imports the
sandbox image (images.py), writes a bridge network and starts the kubelet with a client
certificate for system:node:<name> in system:nodes (NodeRestriction applies to it as to any
kubelet), then waits until the node is Ready. Everything lives under one short temporary directory
(unix socket paths are limited to 108 bytes) and every process is stopped on exit; pods the kubelet
started are torn down by stopping containerd's shims with their process groups.

What this machine imposes, and how it is met:
- cgroup v1 only (a tmpfs /sys/fs/cgroup with v1 hierarchies): Kubernetes >= 1.35 refuses cgroup v1
  unless the kubelet is configured with failCgroupV1: false; there is no systemd, so the cgroup
  driver is cgroupfs in both the kubelet and runc.
- no iptables: the bridge plugin runs without IP masquerade and the chain has no portmap (no
  hostPort); pods reach the host at the bridge's gateway address, which is all the tests need.
- no kube-proxy: Service ClusterIPs do not route from pods; pods that must reach the host use
  `node.host_ip`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

from localcluster import gobuild, images, nodeclean, procs, reaper, relay, versions
from localcluster.imagestore import ImageStore

NODE_LABEL = "cifar10-kfp.dev/real-node"
#: The node is tainted so that only pods meant for it (tolerating this) land there: the kwok-based
#: tests schedule pods without a nodeSelector, and on this node they would really run.
NODE_TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
NODE_TOLERATION = {"key": NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
POD_SUBNET = "10.88.0.0/16"
BRIDGE = "cifar10kfp0"
HOST_IP = "10.88.0.1"  # the bridge's own address: pods reach host services here
_START_TIMEOUT_S = 180.0
_NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc")
#: Where the kubelet writes whatever its flags say: the device plugins' socket
#: (/var/lib/kubelet/device-plugins/kubelet.sock) and the container log links. A node that made
#: them removes them.
_FIXED_PATHS = ("/var/lib/kubelet", "/var/log/containers")


def _short_tmp() -> str:
    # containerd's and the shims' unix socket paths live under the node's directory (108 bytes at
    # most): the temporary directory when its path is short, else /tmp.
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) <= 40 else "/tmp"


def node_binaries() -> dict[str, pathlib.Path]:
    """Every binary the node runs, built once per version (gobuild's cache)."""
    names = [*_NODE_BINARIES, *versions.NODE_CNI_PLUGINS]
    return {name: gobuild.ensure_binary(name) for name in names}


def _node_name_and_address(name: str | None) -> tuple[str, str]:
    """The node's name and the address its kubelet listens on.

    The API server reaches a kubelet (logs, exec) at the node's Hostname address first, which is
    the node name; so the node is named after this machine, as a kubelet names itself by default,
    and listens where that name resolves when it is a loopback address ("vm" -> 127.0.0.1 here).
    Anything else listens on 127.0.0.1, and `kubectl logs` cannot reach it (the control plane does
    not prefer InternalIP).
    """
    host = (name or socket.gethostname()).lower()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        address = ""
    return host, address if address.startswith("127.") else "127.0.0.1"


class RealNode(ImageStore):
    """A kubelet + containerd node registered with `cp`; `name`, `host_ip`, `ctr(...)`, `import_image(...)`."""

    def __init__(self, cp, name: str | None = None, cluster_dns: str | None = None):
        self.cp = cp
        # The pods' nameserver (clusterdns.ClusterDns.ip); None: the host's resolv.conf, no cluster names.
        self.cluster_dns = cluster_dns
        self.name, self.kubelet_address = _node_name_and_address(name)
        self.host_ip = HOST_IP
        # Short: containerd's and the shims' unix sockets live under it.
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="c10n-", dir=_short_tmp()))
        self.procs: dict[str, procs.Process] = {}
        self._relays: list[relay.Relay] = []
        self._netns_before: set[pathlib.Path] = set()
        self._store_lock = None
        self.started_in_s: float | None = None

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        started = time.monotonic()
        # One node per machine, and the image store's lock says which: it is claimed before anything
        # machine-wide is touched or tracked, so that a node refused here (its stop, or the reaper
        # after it) undoes nothing of the node that runs (its bridge, pod cgroups, netns).
        self._claim_image_store()
        self._netns_before = nodeclean.sandbox_netns()
        self._made_paths = [p for p in _FIXED_PATHS if not os.path.lexists(p)]
        self._reaper_entry = {
            "dir": str(self.dir),
            "netns_before": sorted(map(str, self._netns_before)),
            "bridge": BRIDGE,
            "made_paths": self._made_paths,
        }
        reaper.track_node(self._reaper_entry)
        reaper.track_dir(self.dir)
        self.bin = node_binaries()
        self._cni_bin_dir = self._link_dir("cni-bin", tuple(versions.NODE_CNI_PLUGINS))
        self._write_cni_config()
        self._start_containerd()
        self._forget_old_pods()
        self.collect_garbage()
        cache = gobuild.cache_root() / "images"
        self.import_image(images.pause_archive(cache))
        self._start_kubelet()
        self._wait_ready()
        self.started_in_s = round(time.monotonic() - started, 1)

    def stop(self) -> None:
        if self._store_lock is None:  # refused, or stopped already: nothing on the machine is its own
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        for one in self._relays:
            one.close()
        self._relays.clear()
        # The kubelet first (so it stops restarting pods), then the pods themselves, then containerd.
        kubelet = self.procs.pop("kubelet", None)
        if kubelet is not None:
            kubelet.stop()
        if "containerd" in self.procs:
            self._remove_all_pods()
        for name in reversed(list(self.procs)):
            self.procs.pop(name).stop()
        nodeclean.kill_shims(self.dir)
        nodeclean.clear_pod_cgroups()
        self._unmount_all()
        nodeclean.remove_netns(self._netns_before)
        nodeclean.remove_paths(getattr(self, "_made_paths", []))
        if self._store_lock is not None:
            self._store_lock.close()  # releases the image store's lock
            self._store_lock = None
        shutil.rmtree(self.dir, ignore_errors=True)
        reaper.untrack("dir", self.dir)
        if getattr(self, "_reaper_entry", None):
            reaper.untrack("node", self._reaper_entry)
        if self.cp is not None and getattr(self.cp, "server", ""):
            self.cp.kubectl("delete", "node", self.name, "--wait=false")

    def _procs(self) -> list[procs.Process]:
        return list(self.procs.values())

    def _link_dir(self, name: str, binaries: tuple[str, ...]) -> pathlib.Path:
        directory = self.dir / name
        directory.mkdir()
        for binary in binaries:
            (directory / binary).symlink_to(self.bin[binary])
        return directory

    # -- containerd ------------------------------------------------------------------------
    @property
    def socket(self) -> pathlib.Path:
        return self.dir / "containerd.sock"

    def _write_cni_config(self) -> None:
        conf_dir = self.dir / "cni-conf"
        conf_dir.mkdir()
        conflist = {
            "cniVersion": "1.0.0",
            "name": "cifar10-kfp",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # No iptables on this machine: masquerading would fail every pod's sandbox.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": HOST_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (conf_dir / "10-cifar10-kfp.conflist").write_text(json.dumps(conflist, indent=1))

    def _containerd_config(self) -> pathlib.Path:
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        text = f"""version = 3
root = "{self._containerd_root}"
state = "{self.dir / "containerd-state"}"

[grpc]
  address = "{self.socket}"

[{runtime}]
  # cgroup v1 without hugetlb here; the kubelet's QoS cgroups come from the kubelet itself.
  tolerate_missing_hugetlb_controller = true
  enable_selinux = false
  # The sandbox this runs in withholds CAP_SYS_RESOURCE, so no process may lower an oom_score_adj
  # ("runc init error(s): nsexec: failed to update /proc/self/oom_score_adj: Permission denied"
  # for the sandbox's -998): containerd clamps every score to its own instead, as rootless does.
  restrict_oom_score_adj = true

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{self.bin["containerd-shim-runc-v2"]}"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{self.bin["runc"]}"
  SystemdCgroup = false

[plugins.'io.containerd.internal.v1.opt']
  # Not the default /opt/containerd, nor NRI's /var/run/nri/nri.sock: nothing outside the node's directory.
  path = "{self.dir / "opt"}"

[plugins.'io.containerd.nri.v1.nri']
  socket_path = "{self.dir / "nri.sock"}"

[{runtime}.cni]
  bin_dirs = ["{self._cni_bin_dir}"]
  conf_dir = "{self.dir / "cni-conf"}"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{images.PAUSE_IMAGE}"
"""
        path = self.dir / "containerd.toml"
        path.write_text(text)
        return path

    def _start_containerd(self) -> None:
        config = self._containerd_config()
        argv = [str(self.bin["containerd"]), f"--config={config}", "--log-level=info"]
        proc = procs.Process("containerd", argv, self.dir / "logs")
        self.procs["containerd"] = proc
        procs.wait_for(
            "containerd socket",
            lambda: self.ctr("version", check=False).returncode == 0,
            _START_TIMEOUT_S,
            [proc],
        )

    # -- kubelet ---------------------------------------------------------------------------
    def _make_bridge(self) -> None:
        # Made here rather than by the bridge plugin at the first pod: the kubelet needs a node IP
        # on a host interface before any pod exists (it refuses loopback), and this one is local.
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
            raise RuntimeError(f"bridge {BRIDGE} already exists: is another RealNode running?")
        prefix = POD_SUBNET.split("/")[1]
        for cmd in (
            ["ip", "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{HOST_IP}/{prefix}", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        self._own_bridge = True

    def _kubelet_config(self) -> pathlib.Path:
        self.kubelet_port = procs.free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine has cgroup v1 only; Kubernetes >= 1.35 refuses it unless told not to.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",  # no systemd here
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.kubelet_address,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": procs.free_port(),
            # The API server of controlplane.py has no kubelet client certificate, so `kubectl logs`
            # reaches the kubelet anonymously; the kubelet listens on loopback only.
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            # A shared build machine's disk is fuller than a node's: no evictions, no image GC of
            # the images imported for the tests (there is no registry to pull them back from).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "failSwapOn": False,
            "podLogsDir": str(self.dir / "pod-logs"),  # not /var/log/pods
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "fileCheckFrequency": "5s",
            "registerWithTaints": [NODE_TAINT],
        }
        if self.cluster_dns:
            config.update(clusterDNS=[self.cluster_dns], clusterDomain="cluster.local")
        path = self.dir / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _start_kubelet(self) -> None:
        self._make_bridge()
        kubeconfig = self.cp.kubeconfig_for(f"system:node:{self.name}", ["system:nodes"])
        argv = [
            str(self.bin["kubelet"]),
            f"--config={self._kubelet_config()}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={HOST_IP}",
            f"--node-labels={NODE_LABEL}=true",
            "--v=2",
        ]
        self.procs["kubelet"] = procs.Process("kubelet", argv, self.dir / "logs")

    def _wait_ready(self) -> None:
        def ready() -> bool:
            proc = self.cp.kubectl("get", "node", self.name, "-o", "json")
            if proc.returncode != 0:
                return False
            conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        procs.wait_for(f"node {self.name} Ready", ready, _START_TIMEOUT_S, self._procs(), interval_s=1)

    # -- teardown --------------------------------------------------------------------------
    def _remove_all_pods(self) -> None:
        # Every task of the CRI namespace is a pod container or sandbox of this node's containerd.
        tasks = self.ctr("tasks", "ls", "-q", check=False, timeout=60).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal=SIGKILL", task, check=False, timeout=30)
        for task in tasks:
            self.ctr("tasks", "delete", "--force", task, check=False, timeout=30)

    def _unmount_all(self) -> None:
        nodeclean.unmount_under(self.dir)
        if getattr(self, "_own_bridge", False):
            subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
            self._own_bridge = False

    def advertise_extended_resource(self, resource: str, count: int) -> None:
        """Advertise `count` of an extended resource (e.g. nvidia.com/gpu) in the node's status.

        The Kubernetes way to declare a resource without a device plugin: the scheduler counts it,
        the kubelet admits pods requesting it and hands them nothing (no device is mounted).
        """
        key = resource.replace("/", "~1")
        patch = [
            {"op": "add", "path": f"/status/capacity/{key}", "value": str(count)},
            {"op": "add", "path": f"/status/allocatable/{key}", "value": str(count)},
        ]
        self.cp.kubectl_ok(
            "patch", "node", self.name, "--subresource=status", "--type=json", "-p", json.dumps(patch)
        )

    # -- host services for pods ------------------------------------------------------------
    def expose(self, target_port: int, port: int) -> str:
        """Make 127.0.0.1:target_port reachable from pods at host_ip:port; returns 'host:port'.

        The host's test services (the embedded object store) bind to loopback only; a relay on the
        bridge address passes the bytes through unchanged, so an S3 request signed for host:port
        verifies at the store.
        """
        self._relays.append(relay.Relay((HOST_IP, port), ("127.0.0.1", target_port)))
        return f"{HOST_IP}:{port}"
