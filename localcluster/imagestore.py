"""The node's containerd image store: its cached root, what is imported into it, and what is dropped.

containerd's root (content store, metadata, overlay snapshots) lives in the cache
(~/.cache/cifar10-kfp/node/containerd-root), so the 6 GB component image is imported and unpacked once
per machine, not once per run. What outlives a run there is garbage-collected at the next node's
start (`collect_garbage`). RealNode (node.py) is this class with a kubelet and a network around it.
"""

from __future__ import annotations

import fcntl
import pathlib
import subprocess
import tempfile

from localcluster import gobuild, images


class ImageStore:
    """The `ctr` of a node's containerd (`self.bin`, `self.socket`) and the image store behind it."""

    bin: dict[str, pathlib.Path]
    socket: pathlib.Path

    def _ctr_argv(self, *args: str) -> list[str]:
        """The pinned ctr in containerd's k8s.io namespace (the one the CRI plugin uses), with `args`."""
        return [str(self.bin["ctr"]), f"--address={self.socket}", "--namespace=k8s.io", *args]

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run `ctr args`; a failure raises with ctr's message unless `check` is False."""
        proc = subprocess.run(
            self._ctr_argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def _image_rows(self) -> list[list[str]]:
        """`ctr images ls`, a row per image name: REF TYPE DIGEST SIZE PLATFORMS LABELS."""
        return [line.split() for line in self.ctr("images", "ls").stdout.splitlines()[1:] if line.strip()]

    def has_image(self, name: str, manifest_digest: str) -> bool:
        """Whether containerd holds image `name` at `manifest_digest`."""
        return any(row[0] == name and manifest_digest in row for row in self._image_rows())

    def import_image(self, image: pathlib.Path | images.OciImage) -> bool:
        """Import an OCI archive file, or stream an OciImage, under its name; False when already there.

        containerd's content store and snapshots outlive the node (see _claim_image_store), so an
        image imported by an earlier run with the same manifest digest is not imported again. Layers
        are unpacked, then dropped from the content store (--discard-unpacked-layers, which only the
        --local import takes): a multi-gigabyte image is kept once, as its snapshot, not twice.
        """
        name, digest = (
            images.archive_ref(image)
            if isinstance(image, pathlib.Path)
            else (image.name, image.manifest_digest)
        )
        if self.has_image(name, digest):
            return False
        flags = ["--local", "--discard-unpacked-layers", "--snapshotter=overlayfs"]
        if isinstance(image, pathlib.Path):
            self.ctr("images", "import", *flags, str(image))
            return True
        # ctr's output goes to a file: an unread pipe could fill and stall the stream.
        with tempfile.TemporaryFile() as output:
            proc = subprocess.Popen(
                self._ctr_argv("images", "import", *flags, "-"),
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=output,
            )
            assert proc.stdin is not None
            try:
                image.write_archive(proc.stdin)
            except BrokenPipeError:
                pass  # ctr stopped reading: its exit status and output below say why
            finally:
                proc.stdin.close()
                proc.wait(timeout=1800)
            output.seek(0)
            said = output.read().decode(errors="replace").strip()
        if proc.returncode != 0:
            raise RuntimeError(f"ctr images import - failed ({proc.returncode}): {said}")
        if not self.has_image(name, digest):
            raise RuntimeError(f"ctr images import - did not import {name}@{digest}: {said}")
        return True

    def _claim_image_store(self) -> None:
        # containerd's root (content store, metadata, overlay snapshots) lives in the cache, so a
        # 6 GB component image is imported and unpacked once per machine, not once per session.
        # One node at a time may use it (containerd holds its database open): a file lock says so.
        self._containerd_root = gobuild.cache_root() / "node" / "containerd-root"
        self._containerd_root.mkdir(parents=True, exist_ok=True)
        self._store_lock = open(self._containerd_root.parent / ".lock", "w")
        try:
            fcntl.flock(self._store_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._store_lock.close()
            self._store_lock = None
            raise RuntimeError(
                f"{self._containerd_root} is in use by another RealNode on this machine"
            ) from None

    def _forget_old_pods(self) -> None:
        # Containers and sandboxes recorded by an earlier node (killed before its teardown, or
        # stopped: its pods' tasks go, their records stay) are deleted before the kubelet starts;
        # their processes and mounts died with that run. One ctr call for all of them, not one each:
        # the cache CI had filled held 584.
        containers = self.ctr("containers", "ls", "-q", check=False, timeout=60).stdout.split()
        if containers:
            self.ctr("containers", "rm", *containers, check=False, timeout=600)
        listing = self.ctr("sandboxes", "ls", check=False, timeout=60).stdout.splitlines()[1:]
        sandboxes = [line.split()[0] for line in listing if line.strip()]
        if sandboxes:
            self.ctr("sandboxes", "rm", "--force", *sandboxes, check=False, timeout=600)

    def collect_garbage(self, *, leases_too: bool = True) -> list[str]:
        """Drop what only an earlier run still holds in the cached image store; returns what went.

        Two things outlive a node and keep gigabytes alive in containerd's cached root: the CRI
        plugin's second name for every image it has run (its ID, `sha256:<config digest>`), which
        after a rebuild replaces the component image's name is the only holder of the old 6 GB
        snapshot; and leases left by a run that stopped mid-import or mid-pod (a lease never
        expires here, and with it an ingest of gigabytes). An ID whose manifest no named image
        has is dropped; every lease goes unless `leases_too` is False (a running node's pods may
        hold one while containerd creates them); containerd's garbage collection runs at once
        (`--sync`), not at its next scheduled pass.
        """
        rows = self._image_rows()
        named = {row[2] for row in rows if not row[0].startswith("sha256:")}
        dangling = [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]
        leases = self.ctr("leases", "ls", "-q").stdout.split() if leases_too else []
        if dangling:
            self.ctr("images", "rm", *([] if leases else ["--sync"]), *dangling, timeout=600)
        if leases:
            self.ctr("leases", "rm", "--sync", *leases, timeout=600)
        return dangling + [f"lease {lease}" for lease in leases]


__all__ = ["ImageStore"]
