"""The images a KFP 2.17.0 run's pods start besides ours: the driver, the launcher and Argo's executor.

Each is the binary this harness builds from the pinned source (versions.py) on a minimal static base,
as upstream's Dockerfiles make them:

- `ghcr.io/kubeflow/kfp-driver:2.17.0`: backend/Dockerfile.driver, /bin/driver (static, netgo),
  user 65532, ENTRYPOINT /bin/driver. The Workflow runs it as `driver` (V2_DRIVER_COMMAND's default).
- `ghcr.io/kubeflow/kfp-launcher:2.17.0`: backend/Dockerfile.launcher, /bin/launcher-v2, user
  65532. Its init container copies the launcher into the step's pod (`launcher-v2 --copy`).
- `quay.io/argoproj/argoexec:v4.0.5`: Argo's Dockerfile (target argoexec), /bin/argoexec on
  gcr.io/distroless/static, ENTRYPOINT argoexec; the controller starts it as `argoexec init|wait`.

Upstream's bases (alpine:3.21 for KFP, distroless/static for Argo) come from registries. What the
binaries need from them is small and made here: a PATH, /tmp (mode 1777: the driver writes its
outputs under /tmp/outputs), /etc/passwd and /etc/group naming root and 65532, and Argo's
hack/nsswitch.conf. The images are streamed into the node's containerd (images.OciImage); nothing
is written to disk but the node's snapshot.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

from localcluster import gobuild, images, sources, versions

DRIVER_IMAGE = f"ghcr.io/kubeflow/kfp-driver:{versions.KFP}"
LAUNCHER_IMAGE = f"ghcr.io/kubeflow/kfp-launcher:{versions.KFP}"
ARGOEXEC_IMAGE = f"quay.io/argoproj/argoexec:{versions.ARGO}"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
_GROUP = "root:x:0:\nnonroot:x:65532:\n"

#: image -> (binary built by gobuild, its path in the image, the image's runtime config)
SPECS: dict[str, tuple[str, str, dict]] = {
    DRIVER_IMAGE: (
        "kfp-driver",
        "bin/driver",
        {"User": "65532", "WorkingDir": "/bin", "Entrypoint": ["/bin/driver"]},
    ),
    LAUNCHER_IMAGE: (
        "kfp-launcher",
        "bin/launcher-v2",
        {"User": "65532", "WorkingDir": "/bin", "Entrypoint": ["/bin/launcher-v2"]},
    ),
    ARGOEXEC_IMAGE: ("argoexec", "bin/argoexec", {"Entrypoint": ["argoexec"]}),
}


def _static_base(root: pathlib.Path) -> None:
    for directory in ("bin", "etc", "home/nonroot", "root"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    (root / "etc" / "passwd").write_text(_PASSWD)
    (root / "etc" / "group").write_text(_GROUP)


def _tree(root: pathlib.Path, image: str) -> pathlib.Path:
    binary, inside, _ = SPECS[image]
    _static_base(root)
    shutil.copy2(gobuild.ensure_binary(binary), root / inside)
    if image == ARGOEXEC_IMAGE:
        nsswitch = sources.ensure_tree(f"argo-workflows-{versions.ARGO}") / "hack" / "nsswitch.conf"
        if nsswitch.is_file():
            shutil.copy2(nsswitch, root / "etc" / "nsswitch.conf")
    return root


def import_all(node) -> dict[str, bool]:
    """Import the three images into `node` (a RealNode); image -> whether it had to be imported."""
    imported = {}
    with tempfile.TemporaryDirectory(prefix="kfp-images-") as scratch:
        for image, (_, _, config) in SPECS.items():
            root = _tree(pathlib.Path(scratch) / image.rsplit("/", 1)[1].replace(":", "-"), image)
            imported[image] = node.import_image(images.OciImage(image, [root], {"Env": [_PATH], **config}))
    return imported
