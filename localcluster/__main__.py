"""`make cluster`: the real control plane (and a Trainer stack) in the foreground until Ctrl-C.

    python -m localcluster [--trainer 2.3|2.2|none] [--gpu-nodes N] [--cpu-nodes N] [--kfp] [--multi-user]

`--kfp` (`make cluster-full`) adds the real KFP 2.17.0 backend (kfp.py) with an embedded object
store as its artifact store, and a real node (node.py) on which runs' pods really run, with what
they need around them (kfppods.py: ML Metadata, the images, seaweedfs.kubeflow:9000). It prints
KF_PIPELINES_ENDPOINT and the MINIO_* settings that reach that store from this machine, so
`cifar10-kfp submit`, `schedule` and `runs` work against it.

It prints `export KUBECONFIG=...` (as `cifar10-kfp store` prints MINIO_*): paste it into another
shell and point kubectl or `cifar10-kfp doctor` at the cluster. Pods stay Running until told
otherwise (see kwok_stages.py); --auto-complete makes Job pods succeed as kwok's default does.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time

from localcluster import gobuild, reaper, versions
from localcluster.controlplane import ControlPlane
from localcluster.kfp import POD_SECURITY_LEVELS
from localcluster.kubeflow import install_trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="2.3", choices=[*versions.TRAINER_STACKS, "none"])
    parser.add_argument("--cpu-nodes", type=int, default=2)
    parser.add_argument("--gpu-nodes", type=int, default=4)
    parser.add_argument("--auto-complete", action="store_true", help="Job pods succeed 1-6 s after Ready")
    parser.add_argument(
        "--kfp", action="store_true", help="also start the real KFP backend and its object store"
    )
    parser.add_argument(
        "--multi-user", action="store_true",
        help="the KFP backend in multi-user mode, with profiles team-a and team-b (implies --kfp; no real node)",
    )  # fmt: skip
    parser.add_argument(
        "--pod-security", default=POD_SECURITY_LEVELS[0], choices=POD_SECURITY_LEVELS,
        help="the Pod Security Standard the runs' namespace enforces (baseline: for images that run as root)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    stop_on_signals()
    reaper.session_marker()  # from here on, whatever this process starts is undone if it is killed
    gobuild.build_all()
    with ControlPlane(
        cpu_nodes=args.cpu_nodes, gpu_nodes=args.gpu_nodes, auto_complete=args.auto_complete
    ) as cp:
        print(
            f"control plane up in {cp.started_in_s:.0f} s (Kubernetes {versions.KUBERNETES}); logs in {cp.dir / 'logs'}"
        )
        with contextlib.ExitStack() as services:
            if args.trainer != "none":
                stack = install_trainer(cp, args.trainer)
                services.callback(stack.stop)
                print(
                    f"Trainer {stack.version} + JobSet {stack.jobset_version} up in {stack.started_in_s:.0f} s"
                )
            if args.multi_user:
                _start_multi_user_kfp(cp, services, args.pod_security)
            elif args.kfp:
                _start_kfp(cp, services, args.pod_security)
            _wait_for_stop(cp)
    return 0


def _start_store(cp, services: contextlib.ExitStack):
    """The embedded object store that the KFP backend uses as its artifact store."""
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore
    from localcluster.kfp import BUCKET

    store = services.enter_context(EmbeddedObjectStore(cp.dir / "kfp-store", bucket=BUCKET))
    # weed makes its unix sockets in /tmp whatever TMPDIR says, and only the store's own stop
    # removes them: if this process is killed, the reaper does.
    remove_sockets = ["rm", "-f", *map(str, store._socket_paths())]
    reaper.track_command(remove_sockets)
    services.callback(reaper.untrack, "command", remove_sockets)
    return store


def _start_kfp(cp, services: contextlib.ExitStack, pod_security: str) -> None:
    from localcluster.kfp import KfpBackend
    from localcluster.prerequisites import missing_for_real_node

    store = _start_store(cp, services)
    pod_defaults = None
    missing = missing_for_real_node()
    if missing:
        print(f"no real node ({missing}): runs' pods go to kwok nodes and never run")
    else:
        from localcluster.clusterdns import ClusterDns
        from localcluster.kfppods import KfpPods
        from localcluster.node import RealNode

        # Cluster DNS: without it each gRPC client of a step (driver, launcher) waits out its service
        # config's TXT lookup on a resolver the pod cannot reach (kfppods.py).
        dns = services.enter_context(ClusterDns(cp))
        node = services.enter_context(RealNode(cp, cluster_dns=dns.ip))
        print(f"real node {node.name} up in {node.started_in_s:.0f} s; importing the images (minutes, once)")
        pods = services.enter_context(KfpPods(cp, node, store, cp.dir / "kfp-pods"))
        pod_defaults = pods.pod_defaults()
    backend = services.enter_context(
        KfpBackend(cp, store, pod_defaults=pod_defaults, pod_security=pod_security)
    )
    if pod_defaults:
        pods.connect(backend)
    print(f"KFP {versions.KFP} backend up in {backend.started_in_s:.0f} s; logs in {backend.dir / 'logs'}")
    if pod_defaults:  # the run pages read ML Metadata, which only the real node's runs have
        from localcluster.kfp_ui import KfpUi

        ui = services.enter_context(KfpUi(cp, backend, pods.mlmd.address, store))
        print(f"KFP UI: {ui.url}  (upload pipelines/compiled/cifar10-training.yaml there; docs/kfp-ui.md)")
    print(f"export KF_PIPELINES_ENDPOINT={backend.endpoint}")
    for key, value in store.env().items():
        print(f"export {key}={value}")


def _start_multi_user_kfp(cp, services: contextlib.ExitStack, pod_security: str) -> None:
    """The API server in multi-user mode and two profiles (kfp.py, profiles.py): requests are authorized
    by the real kube-apiserver; runs in a profile do not execute yet (docs/kfp-backend.md says why)."""
    from localcluster.kfp import KfpBackend
    from localcluster.profiles import KFP_AUDIENCE, TEAMS

    store = _start_store(cp, services)
    backend = services.enter_context(KfpBackend(cp, store, pod_security=pod_security, multi_user=True))
    for profile in TEAMS:
        profile.create(cp, pod_security)
    print(
        f"KFP {versions.KFP} backend (multi-user) up in {backend.started_in_s:.0f} s; logs in {backend.dir / 'logs'}"
    )
    print(f"export KF_PIPELINES_ENDPOINT={backend.endpoint}")
    for profile in TEAMS:
        print(
            f"# {profile.name} (owner {profile.owner}): export KF_PIPELINES_TOKEN=$(kubectl create token "
            f"default-editor -n {profile.name} --audience {KFP_AUDIENCE}); cifar10-kfp runs --namespace {profile.name}"
        )
    print(f"# or as the gateway does: curl -H 'kubeflow-userid: {TEAMS[0].owner}' ...")


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both unwind the `with` blocks, during start-up too; a second signal is
    ignored so that the stop itself runs to its end (the reaper finishes it after a SIGKILL)."""

    def stop(signum, _frame):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def _wait_for_stop(cp) -> None:
    kubectl = gobuild.ensure_binary("kubectl")
    print(f"\nexport KUBECONFIG={cp.kubeconfig}")
    print(f"alias kubectl={kubectl}")
    print("\nPress Ctrl-C to stop and delete everything.", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("stopped")
        sys.exit(0)
