"""The stack a KFP run on real pods needs: the object store, cluster DNS, a real node, kfppods.py and the backend.

`kfp_stack_on_node(control_plane, work)` starts them in order and yields them as one namespace (store,
node, pods, backend); conftest.py's session fixture `kfp_stack` holds one for test_kfp_real_run.py and
test_kfp_ui.py, which the suite runs last (a real node of their own would collide with this one).
"""

from __future__ import annotations

import contextlib
import types

from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from localcluster import kfp as kfp_harness
from localcluster.clusterdns import ClusterDns
from localcluster.kfppods import KfpPods
from localcluster.node import RealNode
from tests.support.paths import ROOT

DATASET = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
DATASET_URI = f"s3://{kfp_harness.BUCKET}/datasets/cifar10-jpeg.tar.gz"


@contextlib.contextmanager
def kfp_stack_on_node(control_plane, work):
    """The object store (with the CIFAR-10 archive), cluster DNS, a real node, what runs' pods need
    (kfppods.py) and the KFP backend, as one namespace."""
    from tests.cluster import conftest  # the closing table's timings

    # Workflows of earlier tests (test_kfp_backend's, whose pods sat on kwok nodes) must not be
    # picked up again by this backend's Argo controller.
    for kind in ("scheduledworkflows", "workflows"):
        control_plane.kubectl("delete", kind, "--all", "-n", kfp_harness.NAMESPACE, "--wait=false")
    with EmbeddedObjectStore(work / "s3", bucket=kfp_harness.BUCKET) as store:
        store.store().put_file(DATASET, DATASET_URI)
        with (
            ClusterDns(control_plane) as dns,
            RealNode(control_plane, cluster_dns=dns.ip) as node,
            KfpPods(control_plane, node, store, work / "pods") as pods,
        ):
            for what, seconds in pods.timings.items():
                conftest._TIMINGS[f"KFP pods: {what}"] = seconds
            with kfp_harness.KfpBackend(control_plane, store, pod_defaults=pods.pod_defaults()) as backend:
                pods.connect(backend)
                yield types.SimpleNamespace(store=store, node=node, pods=pods, backend=backend)
