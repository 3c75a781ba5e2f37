"""`make cluster`: the real control plane (and a Trainer stack) in the foreground until Ctrl-C.

    python -m tests.support.cluster [--trainer 2.3|2.2|none] [--gpu-nodes N] [--cpu-nodes N]

It prints `export KUBECONFIG=...` (as `cifar10-kfp store` prints MINIO_*): paste it into another
shell and point kubectl or `cifar10-kfp doctor` at the cluster. Pods stay Running until told
otherwise (see kwok_stages.py); --auto-complete makes Job pods succeed as kwok's default does.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from tests.support.cluster import gobuild, versions
from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.kubeflow import install_trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.cluster", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--trainer", default="2.3", choices=[*versions.TRAINER_STACKS, "none"])
    parser.add_argument("--cpu-nodes", type=int, default=2)
    parser.add_argument("--gpu-nodes", type=int, default=4)
    parser.add_argument("--auto-complete", action="store_true", help="Job pods succeed 1-6 s after Ready")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gobuild.build_all()
    with ControlPlane(
        cpu_nodes=args.cpu_nodes, gpu_nodes=args.gpu_nodes, auto_complete=args.auto_complete
    ) as cp:
        print(
            f"control plane up in {cp.started_in_s:.0f} s (Kubernetes {versions.KUBERNETES}); logs in {cp.dir / 'logs'}"
        )
        stack = None
        if args.trainer != "none":
            stack = install_trainer(cp, args.trainer)
            print(f"Trainer {stack.version} + JobSet {stack.jobset_version} up in {stack.started_in_s:.0f} s")
        kubectl = gobuild.ensure_binary("kubectl")
        print(f"\nexport KUBECONFIG={cp.kubeconfig}")
        print(f"alias kubectl={kubectl}")
        print("\nPress Ctrl-C to stop and delete everything.", flush=True)
        try:
            while not stop.wait(1.0):
                pass
        finally:
            if stack is not None:
                stack.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
