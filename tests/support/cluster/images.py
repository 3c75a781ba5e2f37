"""OCI images without a registry or a Docker engine, for the real node (node.py).

A layer is a tar of a directory; an image is an OCI image-layout archive (oci-layout, index.json,
blobs/sha256/...) that `ctr -n k8s.io images import` reads. Layers are left uncompressed: they
never cross a network, and gzip on two cores would cost minutes for a large layer.

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

from tests.support.cluster import gobuild, versions

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


def tar_layer(root: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Tar the tree under `root` (paths relative to it, owners as on disk) into `out`.

    `root` may be an overlayfs upper directory: its whiteouts (0:0 character devices) and opaque
    directories become the OCI layer's `.wh.` entries, so a layer can delete what a lower one holds.
    """
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
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
    return out


def _is_opaque(path: pathlib.Path) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode = len(data), 0o644
    tar.addfile(_normalise(info), io.BytesIO(data))


def _json_blob(tar: tarfile.TarFile, doc: dict) -> tuple[str, int]:
    data = json.dumps(doc, sort_keys=True).encode()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    _add_bytes(tar, f"blobs/sha256/{digest[7:]}", data)
    return digest, len(data)


def oci_archive(
    out: pathlib.Path,
    name: str,
    layers: list[pathlib.Path],
    config: dict,
    labels: dict[str, str] | None = None,
) -> pathlib.Path:
    """Write an OCI image-layout tar for image `name` (a full reference) from uncompressed layer tars.

    `config` is the image's runtime config (Entrypoint, Cmd, Env, User, WorkingDir, Labels). The
    layers are written into the archive once, straight from their files (a layer may be gigabytes).
    """
    layer_descs, diff_ids = [], []
    for layer in layers:
        digest = _sha256_file(layer)
        layer_descs.append({"mediaType": OCI_LAYER, "digest": digest, "size": layer.stat().st_size})
        diff_ids.append(digest)  # uncompressed: the diff ID is the layer digest
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {**config, "Labels": {**config.get("Labels", {}), **(labels or {})}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        for layer, desc in zip(layers, layer_descs):
            tar.add(layer, arcname=f"blobs/sha256/{desc['digest'][7:]}", filter=_normalise)
        cfg_digest, cfg_size = _json_blob(tar, image_config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": cfg_digest, "size": cfg_size},
            "layers": layer_descs,
        }
        man_digest, man_size = _json_blob(tar, manifest)
        index = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": man_digest,
                    "size": man_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    # ctr import names the image after this annotation.
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                    },
                }
            ],
        }
        _add_bytes(tar, "index.json", json.dumps(index).encode())
    partial.rename(out)
    return out


def archive_ref(archive: pathlib.Path) -> tuple[str, str]:
    """(image name, manifest digest) of an OCI archive written by oci_archive."""
    with tarfile.open(archive, "r:") as tar:  # uncompressed: headers are read, layer data skipped
        index = json.load(tar.extractfile("index.json"))
    (manifest,) = index["manifests"]
    return manifest["annotations"]["io.containerd.image.name"], manifest["digest"]


def _image_from_tree(out: pathlib.Path, name: str, root: pathlib.Path, config: dict) -> pathlib.Path:
    layer = tar_layer(root, out.with_suffix(".layer.tar"))
    try:
        return oci_archive(out, name, [layer], config)
    finally:
        layer.unlink()


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
