"""OCI images without a registry or a Docker engine, for the real node (node.py).

A layer is a tar of a directory; an image is an OCI image-layout archive (oci-layout, index.json,
blobs/sha256/...) that `ctr -n k8s.io images import` reads. Layers are left uncompressed: they
never cross a network, and gzip on two cores would cost minutes for a large layer. A large image
is never written to disk whole: OciImage streams it from its layer trees (see there).

Two images every node needs are made here from what this machine has:
- the CRI sandbox ("pause") image, under the name containerd asks for, built from the pause.c that
  the Kubernetes module itself ships (build/pause/linux), compiled as its Makefile does;
- a busybox image from Debian's busybox-static package, for smoke pods.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from typing import BinaryIO

from localcluster import gobuild, versions

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
#: The sandbox image containerd v2.4's CRI plugin uses by default (internal/cri/config DefaultSandboxImage).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
PAUSE_VERSION = "3.10.2"
BUSYBOX_IMAGE = "localhost/cifar10-kfp-busybox:1.35"
_BUSYBOX = pathlib.Path("/bin/busybox")


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Reproducible layers: no owner names, no modification times (the digest depends on content).
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _whiteout(tar: tarfile.TarFile, arcname: str) -> None:
    info = tarfile.TarInfo(arcname)
    info.mode = 0o644
    tar.addfile(_normalise(info))


def write_layer(root: pathlib.Path, sink: BinaryIO) -> None:
    """Write the tree under `root` as an uncompressed layer tar to `sink` (a stream; no seeking).

    Paths are relative to `root`, owners as on disk. `root` may be an overlayfs upper directory:
    its whiteouts (0:0 character devices) and opaque directories become the OCI layer's `.wh.`
    entries, so a layer can delete what a lower one holds. The same tree gives the same bytes.
    """
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = pathlib.Path(dirpath, name)
                arcname = str(path.relative_to(root))
                st = path.lstat()
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    _whiteout(tar, str(pathlib.Path(arcname).parent / f".wh.{name}"))
                    continue
                tar.add(path, arcname=arcname, recursive=False, filter=_normalise)
                if stat.S_ISDIR(st.st_mode) and _is_opaque(path):
                    _whiteout(tar, f"{arcname}/.wh..wh..opq")


def _is_opaque(path: pathlib.Path) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


class _Digester(io.RawIOBase):
    """A write-only sink that keeps the sha256 and the length of what passes through it."""

    def __init__(self, forward: BinaryIO | None = None):
        self.sha256, self.size, self._forward = hashlib.sha256(), 0, forward

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        self.sha256.update(data)
        self.size += len(data)
        if self._forward is not None:
            self._forward.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256.hexdigest()}"


def _add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode = len(data), 0o644
    tar.addfile(_normalise(info), io.BytesIO(data))


def _json_bytes(doc: dict) -> tuple[bytes, str]:
    data = json.dumps(doc, sort_keys=True).encode()
    return data, f"sha256:{hashlib.sha256(data).hexdigest()}"


class OciImage:
    """An OCI image-layout archive made on demand from layer trees, never stored whole.

    A layer may be gigabytes (the component image's dependencies), so no layer tar and no archive
    is written to disk: the layers are hashed in a first pass over the trees (`manifest_digest` is
    then known), and `write_archive` streams the archive in a second pass, e.g. into
    `ctr images import -`. The trees must not change in between: the second pass checks its digests.
    `config` is the image's runtime config (Entrypoint, Cmd, Env, User, WorkingDir, Labels).
    """

    def __init__(self, name: str, trees: list[pathlib.Path], config: dict):
        self.name, self.trees = name, trees
        self.layers = []
        for tree in trees:
            digester = _Digester()
            write_layer(tree, digester)
            self.layers.append({"mediaType": OCI_LAYER, "digest": digester.digest, "size": digester.size})
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            # Uncompressed layers: each diff ID is the layer's digest.
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in self.layers]},
        }
        self.config_bytes, config_digest = _json_bytes(image_config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(self.config_bytes)},
            "layers": self.layers,
        }
        self.manifest_bytes, self.manifest_digest = _json_bytes(manifest)

    def _index(self) -> dict:
        return {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": self.manifest_digest,
                    "size": len(self.manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    # ctr import names the image after this annotation.
                    "annotations": {
                        "io.containerd.image.name": self.name,
                        "org.opencontainers.image.ref.name": self.name.rpartition(":")[2],
                    },
                }
            ],
        }

    def write_archive(self, sink: BinaryIO) -> None:
        """Stream the OCI archive (oci-layout, blobs/sha256/..., index.json) to `sink`."""
        with tarfile.open(fileobj=sink, mode="w|") as tar:
            _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            for tree, layer in zip(self.trees, self.layers):
                self._stream_layer(tar, tree, layer)
            for data, digest in ((self.config_bytes, None), (self.manifest_bytes, self.manifest_digest)):
                digest = digest or f"sha256:{hashlib.sha256(data).hexdigest()}"
                _add_bytes(tar, f"blobs/sha256/{digest[7:]}", data)
            _add_bytes(tar, "index.json", json.dumps(self._index()).encode())

    @staticmethod
    def _stream_layer(tar: tarfile.TarFile, tree: pathlib.Path, layer: dict) -> None:
        # The tar member's header needs the size first (known from the first pass); its data is the
        # layer tar written again, by a thread, into a pipe that tarfile reads.
        info = _normalise(tarfile.TarInfo(f"blobs/sha256/{layer['digest'][7:]}"))
        info.size, info.mode = layer["size"], 0o644
        read_fd, write_fd = os.pipe()
        streamed: list[_Digester] = []
        failure: list[BaseException] = []

        def produce() -> None:
            with open(write_fd, "wb", buffering=1 << 20) as pipe:
                streamed.append(_Digester(forward=pipe))
                try:
                    write_layer(tree, streamed[0])
                except BaseException as exc:  # re-raised by the reading side below
                    failure.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        with open(read_fd, "rb", buffering=1 << 20) as pipe:
            try:
                tar.addfile(info, pipe)
            except OSError as exc:  # the tree shrank, the producer failed, or the sink is gone
                producer.join(timeout=5)
                if failure:
                    raise failure[0] from exc
                if not producer.is_alive() and streamed[0].digest != layer["digest"]:
                    raise RuntimeError(f"layer {tree} changed between its two passes: {exc}") from exc
                raise
            pipe.read()  # drains whatever a grown tree added, so that the producer ends
        producer.join()
        if failure:
            raise failure[0]
        got = (streamed[0].digest, streamed[0].size)
        if got != (layer["digest"], layer["size"]):
            raise RuntimeError(
                f"layer {tree} changed between its two passes: {layer['digest']} became {got[0]}"
            )


def oci_archive(out: pathlib.Path, image: OciImage) -> pathlib.Path:
    """Write `image` as an OCI archive file (for small images that are cached whole)."""
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as fh:
        image.write_archive(fh)
    partial.rename(out)
    return out


def archive_ref(archive: pathlib.Path) -> tuple[str, str]:
    """(image name, manifest digest) of an OCI archive written by oci_archive."""
    with tarfile.open(archive, "r:") as tar:  # uncompressed: headers are read, layer data skipped
        index = json.load(tar.extractfile("index.json"))
    (manifest,) = index["manifests"]
    return manifest["annotations"]["io.containerd.image.name"], manifest["digest"]


def _image_from_tree(out: pathlib.Path, name: str, root: pathlib.Path, config: dict) -> pathlib.Path:
    return oci_archive(out, OciImage(name, [root], config))


def pause_archive(cache: pathlib.Path) -> pathlib.Path:
    """The sandbox image as an OCI archive, built once into `cache`."""
    out = cache / f"pause-{PAUSE_VERSION}.oci.tar"
    if out.is_file():
        return out
    source = gobuild.module_dir("k8s.io/kubernetes", versions.KUBERNETES) / "build/pause/linux/pause.c"
    with tempfile.TemporaryDirectory(prefix="pause-") as scratch:
        root = pathlib.Path(scratch, "rootfs")
        root.mkdir()
        # The flags of build/pause/Makefile (CFLAGS = -Os -Wall -Werror -static -DVERSION=...).
        subprocess.run(
            ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-cifar10-kfp"]
            + ["-o", str(root / "pause"), str(source)],
            check=True,
            capture_output=True,
            text=True,
        )
        cache.mkdir(parents=True, exist_ok=True)
        return _image_from_tree(out, PAUSE_IMAGE, root, {"Entrypoint": ["/pause"], "User": "65535:65535"})


def busybox_archive(cache: pathlib.Path) -> pathlib.Path:
    """A busybox image from Debian's busybox-static (`apt-get install busybox-static`)."""
    out = cache / "busybox.oci.tar"
    if out.is_file():
        return out
    if not _BUSYBOX.is_file():
        raise RuntimeError(f"{_BUSYBOX} is missing: install Debian's busybox-static package")
    with tempfile.TemporaryDirectory(prefix="busybox-") as scratch:
        root = pathlib.Path(scratch, "rootfs")
        (root / "bin").mkdir(parents=True)
        (root / "etc").mkdir()
        (root / "tmp").mkdir()
        (root / "tmp").chmod(0o1777)
        shutil.copy2(_BUSYBOX, root / "bin" / "busybox")
        applets = subprocess.run([str(_BUSYBOX), "--list"], check=True, capture_output=True, text=True)
        for applet in applets.stdout.split():
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:0::/tmp:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        cache.mkdir(parents=True, exist_ok=True)
        return _image_from_tree(out, BUSYBOX_IMAGE, root, {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})
