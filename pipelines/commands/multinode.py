"""``cifar10-kfp train``'s multi-node options: torchrun's rendezvous, elastic mode, and node 0's upload.

Every node of a run runs the same command; torchrun's c10d rendezvous on node 0's address joins
them. ``--nnodes MIN:MAX`` is torchrun's elastic mode. On one machine, as a local proof::

    cifar10-kfp train --data s3://... --checkpoint-uri s3://.../ckpt --output-dir out-a \\
        --nnodes 1:2 --rdzv-endpoint 127.0.0.1:29400 --rdzv-id demo --max-restarts 3
    # and the same with --output-dir out-b in another shell: the second agent joins the first

A Kubeflow Trainer ``TrainJob`` runs exactly this on each node (``cifar10_kfp.trainjob``), with
``--upload-to`` so that the node holding rank 0 puts the outputs in the object store.
"""

from __future__ import annotations

import argparse
import json


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
    group.add_argument("--upload-to", default="", metavar="URI",
                       help="the node that holds rank 0 uploads model/, history.json and metrics.json here")  # fmt: skip


def rendezvous_from_args(args: argparse.Namespace):
    """The ``Rendezvous`` of a multi-node run, or None on one node."""
    from cifar10_kfp.distributed import Rendezvous

    elastic = ":" in args.nnodes and len(set(args.nnodes.split(":"))) > 1
    restarts = args.max_restarts if args.max_restarts is not None else (3 if elastic else 0)
    if args.nnodes == "1" and not args.rdzv_endpoint:
        return Rendezvous(max_restarts=restarts) if restarts else None
    return Rendezvous(args.nnodes, args.rdzv_endpoint, args.rdzv_id, restarts)


def finish(result, args: argparse.Namespace) -> None:
    """Upload the outputs if asked and this node has them; print the metrics (or say where they are)."""
    if not result.wrote_outputs:
        print(
            f"this node did not hold rank 0 at the end: the outputs are on the node that did ({args.nnodes} nodes)"
        )
        return
    if args.upload_to:
        from cifar10_kfp.storage import open_store

        open_store().put_dir(result.output_dir, args.upload_to)
        print(f"uploaded outputs to {args.upload_to}")
    print(json.dumps(result.metrics, indent=2, sort_keys=True))
