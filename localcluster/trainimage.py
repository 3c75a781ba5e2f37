"""The component image of images/train/Dockerfile, built here without Docker or a registry.

The Dockerfile's steps, layer for layer, on a Debian base instead of the PyTorch runtime image:

  base    debootstrap --variant=minbase bookworm, with python3 (3.11, the ABI of this machine's
          wheels) and ca-certificates. The PyTorch image is Ubuntu + conda Python + torch; here
          torch comes in the dependency layer instead, as the same wheels this checkout tests with.
  user    `useradd --uid 1000 --gid 0 ... app`, /gcs /minio /s3 owned 1000:0, mode 0775 (the
          Dockerfile's RUN, executed in a chroot over an overlay whose upper directory is the layer).
  deps    the installed distributions of images/train/requirements.txt and their dependencies,
          exactly the files (RECORD) of the packages installed in this machine's environment.
  app     our wheel (`pip wheel --no-deps .`, the builder stage), installed with
          `pip install --no-index` in the chroot (so every dependency must already be present),
          then `cifar10-kfp --help` and the kfp import check, as the Dockerfile does.

The config is the Dockerfile's: ENV, USER 1000:0, WORKDIR /home/app, ENTRYPOINT ["cifar10-kfp"],
CMD ["--help"], the OCI labels. No archive is written: ensure_imported streams the layers into the
node's containerd, once per digest of the inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from packaging.requirements import Requirement

from localcluster import images

REPO = pathlib.Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "images" / "train" / "requirements.txt"
#: The name the committed YAML (deploy/, pipelines/compiled/) runs.
IMAGE = "ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0"
VERSION = "0.1.0"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SITE = "usr/local/lib/python3.11/dist-packages"  # Debian python3's path for locally installed packages
ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "PIP_NO_CACHE_DIR=1",
    "PIP_DISABLE_PIP_VERSION_CHECK=1",
    "HOME=/home/app",
    "MPLCONFIGDIR=/tmp/matplotlib",
    "MPLBACKEND=Agg",
]


def _sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def dependency_closure() -> list[md.Distribution]:
    """The installed distributions of requirements.txt and everything they require (no extras)."""
    todo = [Requirement(line) for line in REQUIREMENTS.read_text().splitlines() if line and line[0] != "#"]
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) already expanded
    while todo:
        req = todo.pop()
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        dist = seen.get(key) or md.distribution(req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            raise RuntimeError(f"installed {req.name} {dist.version} does not satisfy {req}")
        seen[key] = dist
        # A requirement's extras pull in more (torch needs cuda-toolkit[cudart,...] for libcudart).
        for extra in ("", *sorted(req.extras)):
            if (key, extra) in done:
                continue
            done.add((key, extra))
            for spec in dist.requires or []:
                sub = Requirement(spec)
                if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                    todo.append(sub)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def _link_tree(dists: list[md.Distribution], root: pathlib.Path) -> None:
    # Hard links (no 5 GB copy), falling back to copies across file systems. Files RECORD places
    # outside site-packages (the dependencies' console scripts) are left out, and so is bytecode:
    # a .pyc records its source's mtime, which differs between two installs of the same wheel (so
    # the 6 GB layer would differ between this checkout's environment and CI's) and is stale in
    # the image anyway (layers carry no mtimes). APP_STEP compiles it in the image instead.
    for dist in dists:
        for rel in dist.files or []:
            src = pathlib.Path(dist.locate_file(rel))
            if str(rel).startswith("..") or "__pycache__" in rel.parts or not src.is_file():
                continue
            dst = root / SITE / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel.name == "RECORD" and rel.parent.name.endswith(".dist-info"):
                # It lists the console scripts left out, with hashes of their shebangs (which name
                # this environment's path): the image's RECORD lists only what the image holds.
                lines = src.read_text().splitlines(keepends=True)
                dst.write_text("".join(line for line in lines if not line.startswith("../")))
                continue
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


@contextlib.contextmanager
def _chroot_overlay(lowers: list[pathlib.Path], upper: pathlib.Path, scratch: pathlib.Path):
    """Mount lowers (top first) + upper at a merged directory with /dev and /proc; yields it.

    What a command run in it writes lands in `upper`, which is then exactly the layer's diff.
    """
    merged, work = scratch / "merged", scratch / "work"
    for d in (merged, work, upper):
        d.mkdir(parents=True, exist_ok=True)
    lower = ":".join(str(d) for d in lowers)
    _sh(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(merged),
        ]
    )
    mounted = [merged]
    try:
        _sh(["mount", "--bind", "/dev", str(merged / "dev")])
        mounted.append(merged / "dev")
        _sh(["mount", "-t", "proc", "proc", str(merged / "proc")])
        mounted.append(merged / "proc")
        yield merged
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _run_in(root: pathlib.Path, script: str) -> str:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    env.update(e.split("=", 1) for e in ENV if not e.startswith(("PATH=", "HOME=")))
    return _sh(
        ["chroot", str(root), "/bin/bash", "-o", "pipefail", "-ec", script], env=env, timeout=1800
    ).stdout


def _base_rootfs(cache: pathlib.Path) -> pathlib.Path:
    root = cache / f"debian-{SUITE}-minbase-python3"
    if (root / "usr" / "bin" / "python3").exists():
        return root
    tmp = cache / f".tmp-debian-{SUITE}"
    shutil.rmtree(tmp, ignore_errors=True)
    _sh(
        ["debootstrap", "--variant=minbase", "--include=python3,ca-certificates", SUITE, str(tmp), MIRROR],
        timeout=1800,
    )
    # Like the base image: no apt lists or package caches in the layer.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (tmp / junk).glob("*"):
            if entry.is_file():
                entry.unlink()
    tmp.rename(root)
    return root


def _wheel(out_dir: pathlib.Path) -> pathlib.Path:
    # The builder stage: the requirements drift check, then the wheel of our three packages.
    _sh([sys.executable, str(REPO / "images/train/requirements.py"), "--check"])
    _sh(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(out_dir),
            str(REPO),
        ]
    )
    (wheel,) = out_dir.glob("cifar10_kfp-*.whl")
    return wheel


def _source_digest(dists: list[md.Distribution]) -> str:
    digest = hashlib.sha256(pathlib.Path(__file__).read_bytes())
    digest.update(json.dumps([(d.metadata["Name"], d.version) for d in dists]).encode())
    for top in ("pyproject.toml", "cifar10_kfp", "components", "pipelines", "images/train"):
        paths = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


USER_STEP = """
useradd --uid 1000 --gid 0 --create-home --home-dir /home/app --shell /usr/sbin/nologin app
mkdir -p /gcs /minio /s3
chown 1000:0 /gcs /minio /s3
chmod 0775 /gcs /minio /s3 /home/app
ln -sf python3 /usr/bin/python   # the base image's `python`
"""

APP_STEP = """
# The Dockerfile's dependency step imports torch and torchvision (to pin them): a missing CUDA
# runtime library fails here, not in a pod.
python -c 'import torch, torchvision; print("torch", torch.__version__)'
PYTHONPATH=/tmp/pip python -m pip install --no-index --no-deps --break-system-packages \
    --find-links /tmp/dist "cifar10-kfp=={version}"
PYTHONPATH=/tmp/pip python -m pip check --break-system-packages >/dev/null 2>&1 || true
rm -rf /tmp/dist /tmp/pip
# Bytecode checked by source hash, not mtime (layers carry none): without it every pod's python
# compiles torch and kfp again (about 7 s per process here), and as uid 1000 cannot keep the result.
# A file written for a later Python (torch's testing/_internal/py312_intrinsics.py) fails to compile
# and is left without bytecode, as pip leaves it: that alone must not fail the build.
python -m compileall -qq -f -j 0 --invalidation-mode checked-hash /usr/local/lib/python3.11/dist-packages || true
cifar10-kfp --help > /dev/null
python -c 'import kfp, cifar10_kfp, cifar10_kfp_components.image; print("kfp", kfp.__version__)'
"""


CONFIG = {
    "Env": ENV,
    "User": "1000:0",
    "WorkingDir": "/home/app",
    "Entrypoint": ["cifar10-kfp"],
    "Cmd": ["--help"],
    "Labels": {
        "org.opencontainers.image.title": "cifar10-kfp",
        "org.opencontainers.image.version": VERSION,
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
}


@contextlib.contextmanager
def _layer_trees(cache: pathlib.Path, dists: list[md.Distribution]):
    """Yield the image's four layer trees (base, user, deps, app), built in a scratch directory."""
    base = _base_rootfs(cache)
    # A build killed mid-way leaves its scratch directory (hard links into the environment): it goes,
    # unless something is still mounted in it (its chroot's /dev and /proc are the host's).
    mounts = [line.split()[1] for line in pathlib.Path("/proc/self/mounts").read_text().splitlines()]
    for stale in cache.glob("train-image-*"):
        if not any(m == str(stale) or m.startswith(f"{stale}/") for m in mounts):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="train-image-", dir=cache) as tmp:
        work = pathlib.Path(tmp)
        user, deps, app = work / "layer-user", work / "layer-deps", work / "layer-app"
        with _chroot_overlay([base], user, work / "o1") as root:
            _run_in(root, USER_STEP)
        _link_tree(dists, deps)
        wheel = _wheel(work / "dist")
        with _chroot_overlay([deps, user, base], app, work / "o2") as root:
            (root / "tmp" / "dist").mkdir(parents=True)
            shutil.copy2(wheel, root / "tmp" / "dist" / wheel.name)
            # pip itself is not in the image (as in the final stage of the Dockerfile, pip comes
            # from the base); it runs from this environment's copy, put on PYTHONPATH for the step.
            shutil.copytree(
                pathlib.Path(md.distribution("pip").locate_file("pip")), root / "tmp" / "pip" / "pip"
            )
            _run_in(root, APP_STEP.format(version=VERSION))
        yield [base, user, deps, app]


def ensure_imported(node, cache: pathlib.Path) -> bool:
    """Import the component image into `node` (a RealNode) unless it holds this build; True if imported.

    No archive is kept: the image (about 6 GB, nearly all of it torch and its CUDA libraries) is
    streamed from its layer trees into containerd, whose snapshot is then its only copy on disk. A
    small record, named by a digest of the inputs, remembers the manifest digest of the last build.
    """
    dists = dependency_closure()
    record = cache / f"cifar10-kfp-{VERSION}-{_source_digest(dists)}.json"
    if record.is_file():
        ref = json.loads(record.read_text())
        if node.has_image(ref["name"], ref["manifest_digest"]):
            return False
    cache.mkdir(parents=True, exist_ok=True)
    # Archives that an earlier harness kept (6 GB each) and records of other inputs go first.
    for stale in [*cache.glob("cifar10-kfp-*.oci.tar"), *cache.glob("cifar10-kfp-*.json")]:
        stale.unlink()
    with _layer_trees(cache, dists) as trees:
        image = images.OciImage(IMAGE, trees, CONFIG)
        node.import_image(image)
    node.collect_garbage(leases_too=False)  # the build this one replaced: 6 GB, gone now
    record.write_text(json.dumps({"name": IMAGE, "manifest_digest": image.manifest_digest}))
    return True
