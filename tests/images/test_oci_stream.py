"""The OCI archive the real node imports (localcluster/images.py), streamed from layer trees.

The component image is never written whole: its layers are hashed in one pass and streamed in a
second. These tests read the streamed archive back as containerd would: every blob must match its
digest, and a tree that changes between the passes must fail instead of importing a wrong layer.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from localcluster import images


def _tree(root, files: dict[str, bytes]):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _blobs(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_every_blob_matches_its_digest_and_the_manifest_lists_the_layers(tmp_path):
    base = _tree(tmp_path / "base", {"etc/os-release": b"debian\n", "bin/tool": os.urandom(300_000)})
    app = _tree(tmp_path / "app", {"home/app/model.py": b"print('hi')\n"})
    image = images.OciImage("example.local/demo:1", [base, app], {"User": "1000:0"})
    sink = io.BytesIO()
    image.write_archive(sink)
    blobs = _blobs(sink.getvalue())

    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1], name
    index = json.loads(blobs["index.json"])
    (entry,) = index["manifests"]
    assert entry["digest"] == image.manifest_digest
    assert entry["annotations"]["io.containerd.image.name"] == "example.local/demo:1"
    manifest = json.loads(blobs[f"blobs/sha256/{image.manifest_digest[7:]}"])
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    assert config["config"]["User"] == "1000:0"

    # The layers hold the trees' files, at the paths relative to each tree.
    first = blobs[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"]
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:") as layer:
        assert layer.extractfile("bin/tool").read() == (base / "bin/tool").read_bytes()
        assert layer.getmember("bin/tool").mtime == 0  # reproducible: no timestamps


def test_the_same_trees_give_the_same_digest_and_a_changed_file_another(tmp_path):
    tree = _tree(tmp_path / "t", {"a.txt": b"one"})
    first = images.OciImage("example.local/demo:1", [tree], {}).manifest_digest
    assert images.OciImage("example.local/demo:1", [tree], {}).manifest_digest == first
    (tree / "a.txt").write_bytes(b"two")
    assert images.OciImage("example.local/demo:1", [tree], {}).manifest_digest != first


def test_a_tree_changed_between_the_passes_is_refused(tmp_path):
    tree = _tree(tmp_path / "t", {"a.txt": b"one"})
    image = images.OciImage("example.local/demo:1", [tree], {})
    (tree / "b.txt").write_bytes(b"added after hashing")
    with pytest.raises(RuntimeError, match="changed between its two passes"):
        image.write_archive(io.BytesIO())


def test_an_archive_file_names_its_image_and_manifest(tmp_path):
    tree = _tree(tmp_path / "t", {"pause": b"\x7fELF"})
    image = images.OciImage("registry.k8s.io/pause:3.10.2", [tree], {"Entrypoint": ["/pause"]})
    out = images.oci_archive(tmp_path / "pause.oci.tar", image)
    assert images.archive_ref(out) == ("registry.k8s.io/pause:3.10.2", image.manifest_digest)
    assert not (tmp_path / "pause.oci.tar.partial").exists()


def test_a_tree_that_shrank_between_the_passes_is_refused(tmp_path):
    tree = _tree(tmp_path / "t", {"a.txt": b"x" * 100_000})
    image = images.OciImage("example.local/demo:1", [tree], {})
    (tree / "a.txt").write_bytes(b"x")
    with pytest.raises(RuntimeError, match="changed between its two passes"):
        image.write_archive(io.BytesIO())
