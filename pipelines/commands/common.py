"""Flags and parsing that several ``cifar10-kfp`` commands share, each defined once.

Commands import from here, never from each other: ``--param KEY=VALUE`` (``parse_key_values``),
the cluster-policy flags that ``compile``, ``submit`` and ``schedule`` bake into a spec
(``add_policy_flags`` / ``policy_from_args``), and the KFP connection and login flags of
``submit``, ``schedule`` and ``runs`` (``add_connection_flags`` / ``login_from_args``), and the
multi-node flags of ``train``, which a Kubeflow Trainer node runs too (``add_multinode_arguments`` /
``rendezvous_from_args`` / ``finish``), and where ``runs --local``, ``tensorboard`` and ``predict`` find the
store ``run-local`` used (``add_local_store_flag`` / ``missing_local_store``).
"""

from __future__ import annotations

import argparse
import json
import sys

PIPELINES = ("training", "sweep", "tune")


def parse_key_values(items: list[str], *, flag: str = "--param") -> dict[str, str]:
    """``["a=1", "b=x=y"]`` -> ``{"a": "1", "b": "x=y"}``; a missing ``=`` or key is an error naming the item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def add_local_store_flag(parser: argparse.ArgumentParser, when: str) -> None:
    """``--data-dir``: the embedded store's data that ``run-local`` left (under its default output root)."""
    from cifar10_kfp_pipelines.local import DEFAULT_OUTPUT_ROOT, STORE_DIR_NAME

    default = f"{DEFAULT_OUTPUT_ROOT.as_posix()}/{STORE_DIR_NAME}"
    parser.add_argument(
        "--data-dir", default=default, help=f"{when}: the embedded store's data (default {default})"
    )


def missing_local_store(data_dir: str) -> str:
    """Why ``--data-dir`` cannot serve as the object store ("" when it can, or MINIO_ENDPOINT is set).

    Checked before an embedded store starts on it, so that a command run where no ``run-local``
    ran says so instead of creating an empty store there.
    """
    import os
    from pathlib import Path

    if os.environ.get("MINIO_ENDPOINT") or (Path(data_dir) / "data").is_dir():
        return ""
    return (
        f"no local object store at {Path(data_dir).absolute()} (and MINIO_ENDPOINT is not set): "
        "`cifar10-kfp run-local` (or `make run`) keeps one there; pass --data-dir for another, or export "
        "MINIO_ENDPOINT/MINIO_ACCESS_KEY/MINIO_SECRET_KEY for a running store"
    )


def add_param_flag(parser: argparse.ArgumentParser, help: str = "a pipeline parameter (repeatable)") -> None:
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_pipeline_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline", choices=PIPELINES, default="training", help="which pipeline (default training)"
    )


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The cluster settings a compiled spec carries (see ``cifar10_kfp_pipelines.policy.ClusterPolicy``)."""
    parser.add_argument(
        "--image", default=None,
        help="container image for every step (default: components/image.py's reference, or CIFAR10_KFP_IMAGE)",
    )  # fmt: skip
    parser.add_argument(
        "--minio-endpoint",
        default=None,
        help="object-store host:port the steps use (default seaweedfs.kubeflow:9000)",
    )
    parser.add_argument("--minio-secure", action="store_true", help="the object store speaks TLS")
    parser.add_argument(
        "--strict-credentials", action="store_true",
        help="every step refuses standalone KFP's well-known default credentials (by default: accepted with a warning)",
    )  # fmt: skip
    resources = parser.add_argument_group(
        "resources", "Kubernetes requests and limits, as REQUEST[:LIMIT] (the limit defaults to the request)"
    )
    resources.add_argument(
        "--train-cpu", metavar="REQ[:LIM]",
        help="CPU of the single-node train step (default 4:8); e.g. 1 to train on a small CPU node",
    )  # fmt: skip
    resources.add_argument(
        "--train-memory", metavar="REQ[:LIM]", help="memory of the train step (default 16Gi:32Gi)"
    )
    resources.add_argument("--step-cpu", metavar="REQ[:LIM]", help="CPU of every other step (default 1:2)")
    resources.add_argument(
        "--step-memory", metavar="REQ[:LIM]", help="memory of every other step (default 2Gi:8Gi)"
    )


def policy_from_args(args: argparse.Namespace):
    """The default ``ClusterPolicy`` with the policy flags of ``args`` applied (``--cache`` where a command has it)."""
    from dataclasses import replace

    from cifar10_kfp_pipelines.policy import ClusterPolicy

    policy = ClusterPolicy()
    if args.image:
        policy = replace(policy, image=args.image)
    if args.minio_endpoint:
        policy = replace(policy, minio_endpoint=args.minio_endpoint)
    if args.minio_secure:
        policy = replace(policy, minio_secure=True)
    if getattr(args, "strict_credentials", False):
        policy = replace(policy, strict_credentials=True)
    if getattr(args, "cache", None):
        policy = policy.with_cached_steps(args.cache)
    return policy.with_resources(
        train_cpu=args.train_cpu,
        train_memory=args.train_memory,
        step_cpu=args.step_cpu,
        step_memory=args.step_memory,
    )


def warn_if_unpublished_image(image: str, *, stream=None) -> bool:
    """Say loudly, on stderr, that a spec with the project's default image tag will not start on a cluster.

    ``ghcr.io/cifar10-kfp/cifar10-kfp:<version>`` names the image ``make image`` builds; nothing publishes
    it, so every pod of such a run would stay in ImagePullBackOff. Returns whether it warned.
    """
    from cifar10_kfp_components.image import REGISTRY_DEFAULT

    if not image.startswith(f"{REGISTRY_DEFAULT}:"):
        return False
    bar = "!" * 100
    print(
        f"{bar}\nWARNING: the steps use the default image {image}, which is NOT published: pods of this spec\n"
        "will not start (ImagePullBackOff). Build and push the image (`make image REGISTRY=registry.example.com/ml`,\n"
        "images/README.md) and compile with --image <your registry>/cifar10-kfp:<tag> or CIFAR10_KFP_IMAGE.\n"
        f"{bar}",
        file=stream or sys.stderr,
    )
    return True


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """Where the KFP API is and how to log in to it (see ``cifar10_kfp_pipelines.kfp_client.Login``)."""
    parser.add_argument(
        "--host", default=None,
        help="KFP API URL, e.g. http://localhost:8080 (default: KF_PIPELINES_ENDPOINT; inside the cluster, "
        "the in-cluster KFP service)",
    )  # fmt: skip
    parser.add_argument(
        "--namespace",
        default="kubeflow",
        help="KFP namespace (your profile namespace in multi-user Kubeflow)",
    )
    parser.add_argument(
        "--token", default=None,
        help="bearer token for multi-user Kubeflow (default: KF_PIPELINES_TOKEN; inside the cluster, the pod's "
        "KFP service-account token). Prefer the variable: a flag is visible in the process list",
    )  # fmt: skip
    parser.add_argument(
        "--cookies", default=None, metavar="NAME=VALUE[; ...]",
        help="session cookie(s) of a Dex / oauth2-proxy login, e.g. 'oauth2_proxy_kubeflow=...' copied from the "
        "browser (default: KF_PIPELINES_COOKIES)",
    )  # fmt: skip


def login_from_args(args: argparse.Namespace):
    """The ``Login`` the connection flags (or their environment variables) describe."""
    from cifar10_kfp_pipelines.kfp_client import Login

    return Login.resolve(host=args.host, token=args.token, cookies=args.cookies)


# ------------------------------------------------------------- train: several nodes
#
# Every node of a run runs the same ``cifar10-kfp train`` command; torchrun's c10d rendezvous on node 0's
# address joins them, and ``--nnodes MIN:MAX`` is torchrun's elastic mode. A Kubeflow Trainer TrainJob
# runs exactly this on each node (cifar10_kfp.trainjob.node_command), with ``--upload-to`` so that the node
# holding rank 0 puts the outputs in the object store. On one machine, as a local proof, run it twice with
# ``--rdzv-endpoint 127.0.0.1:<port>`` and different ``--output-dir``s (docs/multi-node.md).


def add_multinode_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "several nodes (torchrun c10d rendezvous; every node runs the same command)"
    )
    group.add_argument("--nnodes", default="1",
                       help="N nodes, or MIN:MAX for elastic training that goes on while MIN are alive (default 1)")  # fmt: skip
    group.add_argument("--rdzv-endpoint", default="", metavar="HOST:PORT",
                       help="node 0's address for the rendezvous (its agent hosts the store)")  # fmt: skip
    group.add_argument("--rdzv-id", default="cifar10-kfp",
                       help="the same on every node of a run, distinct between runs (default cifar10-kfp)")  # fmt: skip
    group.add_argument("--max-restarts", type=int, default=None,
                       help="worker-group restarts after a failure such as a lost node (default 3 with MIN:MAX, else 0)")  # fmt: skip
    group.add_argument("--rdzv-wait-s", type=float, default=0.0, metavar="S",
                       help="on a Kubeflow Trainer node other than 0 (PET_NODE_RANK): wait up to S seconds for node 0's "
                       "rendezvous store before starting torchrun (default 0: do not wait)")  # fmt: skip
    group.add_argument("--upload-to", default="", metavar="URI",
                       help="the node that holds rank 0 uploads model/, history.json and metrics.json here")  # fmt: skip


def rendezvous_from_args(args: argparse.Namespace):
    """The ``Rendezvous`` of a multi-node run, or None on one node."""
    from cifar10_kfp.train import Rendezvous

    elastic = ":" in args.nnodes and len(set(args.nnodes.split(":"))) > 1
    restarts = args.max_restarts if args.max_restarts is not None else (3 if elastic else 0)
    if args.nnodes == "1" and not args.rdzv_endpoint:
        return Rendezvous(max_restarts=restarts) if restarts else None
    return Rendezvous(args.nnodes, args.rdzv_endpoint, args.rdzv_id, restarts, args.rdzv_wait_s)


def finish(result, args: argparse.Namespace) -> None:
    """Upload the outputs if asked and this node has them; print the metrics (or say where they are)."""
    if not result.wrote_outputs:
        print(
            f"this node did not hold rank 0 at the end: the outputs are on the node that did ({args.nnodes} nodes)"
        )
        return
    if args.upload_to:
        from cifar10_kfp.storage import open_store
        from cifar10_kfp.trainjob import upload_outputs

        # The completion marker goes last: a TrainJob's launcher takes it as the run's success even when
        # the Job never completes (an elastic run that ended with fewer nodes: cifar10_kfp/trainjob/outputs.py).
        upload_outputs(result.output_dir, args.upload_to, open_store(),
                       world_size=int(result.metrics.get("world_size", 0)))  # fmt: skip
        print(f"uploaded outputs to {args.upload_to}")
    print(json.dumps(result.metrics, indent=2, sort_keys=True))
