"""What the node holding rank 0 uploads for the launcher, and the completion marker written after it.

The marker is the run's own word that the outputs are complete, independent of what the Job controller
makes of the pods: an elastic run that ends with fewer than ``num_nodes`` nodes (one stayed Pending for
want of a GPU, or used up its restarts) never completes its Indexed Job, whose success policy waits for
every index (kubernetes-sigs/jobset ``SuccessPolicy`` defaults to ``All``, pkg/webhooks/jobset_webhook.go).
The launcher takes the marker as success, collects the outputs and deletes the job, pods left over included.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cifar10_kfp.trainjob.manifest import MODEL_SUBDIR, OUTPUT_FILES

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore

log = logging.getLogger(__name__)

DONE_MARKER = "done.json"  # written after everything else below the job's output URI


def upload_outputs(
    output_dir: str | os.PathLike, output_uri: str, store: ObjectStore, *, world_size: int
) -> str:
    """Upload the outputs, then the completion marker (last, so its presence means all else is there)."""
    from cifar10_kfp.storage import join_uri

    store.put_dir(output_dir, output_uri)
    marker = {"complete": True, "world_size": int(world_size), "finished_at": time.time()}
    return store.put_bytes(json.dumps(marker, sort_keys=True).encode(), join_uri(output_uri, DONE_MARKER))


def read_marker(output_uri: str, store: ObjectStore) -> dict | None:
    """The completion marker below ``output_uri``, or None while there is none."""
    from cifar10_kfp.storage import join_uri

    uri = join_uri(output_uri, DONE_MARKER)
    if not store.exists(uri):
        return None
    marker = json.loads(store.get_bytes(uri))
    return marker if marker.get("complete") is True else None


def collect_outputs(output_uri: str, output_dir: str | os.PathLike, store: ObjectStore | None = None) -> Path:
    """Download what the node holding rank 0 uploaded (model/, history.json, metrics.json)."""
    from cifar10_kfp.storage import ObjectStore, join_uri

    store = store or ObjectStore()
    output_dir = Path(output_dir)
    store.get_dir(join_uri(output_uri, MODEL_SUBDIR), output_dir / MODEL_SUBDIR)
    for name in OUTPUT_FILES:
        store.get_file(join_uri(output_uri, name), output_dir / name)
    return output_dir
