"""Which dataset layout an archive holds: the official CIFAR-10 python batches or an image folder.

Detection looks only at member names, so it runs on the verified member list before any
content is parsed.

- ``cifar10-python``: ``<dir>/data_batch_1`` .. ``data_batch_5``, ``<dir>/test_batch`` and
  ``<dir>/batches.meta`` (the official archive uses ``cifar-10-batches-py/``).
- ``image-folder``: ``<root>/train/<class>/<image>`` and ``<root>/test/<class>/<image>`` with
  images in any format Pillow reads, by file extension (``.jpg``, ``.png``, ``.bmp``, ``.webp``,
  ``.gif``, ``.tif`` ...: ``image_extensions()``); ``<root>`` may be empty or any folder.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from cifar10_kfp.data.archives import ArchiveError, ArchiveMember

log = logging.getLogger(__name__)

# The official CIFAR-10 archive (python batches) and its published md5: the default dataset.
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_CHECKSUM = "md5:c58f30108f718f92721af3b95e74349a"
# At most this share of the train split becomes validation: one rule for the pipeline's
# val_fraction (params/table.py) and `cifar10-kfp data --val-fraction` (preprocess.PrepareParams).
MAX_VAL_FRACTION = 0.5

CIFAR10_PYTHON = "cifar10-python"
IMAGE_FOLDER = "image-folder"
FORMATS = (CIFAR10_PYTHON, IMAGE_FOLDER)
OFFICIAL_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
OFFICIAL_FILES = (*OFFICIAL_TRAIN_BATCHES, "test_batch", "batches.meta")
SPLIT_DIRS = ("train", "test")
# Files that operating systems and archivers add; never data.
_JUNK_NAMES = {"thumbs.db", "desktop.ini"}


@functools.cache
def image_extensions() -> tuple[str, ...]:
    """The file extensions of every format this Pillow can open (``predict`` reads the same ones)."""
    from PIL import Image

    Image.init()
    return tuple(sorted(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN))


def is_junk(name: str) -> bool:
    """Hidden files, macOS resource forks and OS thumbnails: ignored everywhere."""
    parts = name.split("/")
    return parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts) or parts[-1].lower() in _JUNK_NAMES


@dataclass
class ImageFolderIndex:
    """The image members of an image-folder archive, grouped by split and class."""

    root: str  # "" or "some/dir"
    class_names: list[str]  # sorted train class folders; label i is class_names[i]
    files: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # split -> [(member name, label)]


@dataclass(frozen=True)
class Layout:
    format: str  # CIFAR10_PYTHON or IMAGE_FOLDER
    root: str  # the folder holding the batches or the train/ and test/ folders ("" for the top level)


def _official_root(files: set[str]) -> str | None:
    for name in files:
        if posixpath.basename(name) == "batches.meta":
            root = posixpath.dirname(name)
            if all(posixpath.join(root, f) in files for f in OFFICIAL_FILES):
                return root
    return None


def _image_folder_roots(files: Iterable[str]) -> set[str]:
    roots = set()
    for name in files:
        parts = name.split("/")
        for i in range(len(parts) - 2):
            if parts[i] == "train":
                roots.add("/".join(parts[:i]))
    return roots


def detect_layout(archive: str, members: list[ArchiveMember]) -> Layout:
    """The layout of a verified member list, or ArchiveError saying what was expected."""
    files = {m.name for m in members if m.kind == "file" and not is_junk(m.name)}
    root = _official_root(files)
    if root is not None:
        return Layout(CIFAR10_PYTHON, root)
    roots = {r for r in _image_folder_roots(files) if any(n.startswith(_join(r, "test/")) for n in files)}
    if len(roots) == 1:
        return Layout(IMAGE_FOLDER, roots.pop())
    if len(roots) > 1:
        raise ArchiveError(f"{archive}: several image-folder roots ({sorted(roots)}); keep exactly one")
    top = sorted({n.split("/")[0] for n in files})[:10]
    raise ArchiveError(
        f"{archive}: unrecognized dataset layout. Expected the official CIFAR-10 python batches "
        "(cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta) or an image folder "
        f"(<root>/train/<class>/<images> and <root>/test/<class>/<images>); top-level entries: {top}"
    )


def _join(root: str, rest: str) -> str:
    return f"{root}/{rest}" if root else rest


def index_image_folder(archive: str, members: list[ArchiveMember], root: str) -> ImageFolderIndex:
    """Group image members by split and class; reject stray files and empty class folders, naming them."""
    per_split: dict[str, dict[str, list[str]]] = {s: {} for s in SPLIT_DIRS}
    ignored: set[str] = set()
    for member in members:
        if is_junk(member.name) or member.kind == "symlink":
            continue
        prefix = _join(root, "")
        if not member.name.startswith(prefix) and root:
            continue
        rel = member.name[len(prefix) :].split("/")
        if rel[0] not in SPLIT_DIRS:
            if rel[0] not in ignored and len(rel) > 1:
                ignored.add(rel[0])
                log.warning(
                    "%s: ignoring %r: only train/ and test/ are read (validation comes out of train/)",
                    archive,
                    _join(root, rel[0] + "/"),
                )
            continue
        split = rel[0]
        if member.kind == "dir":
            if len(rel) == 2:
                per_split[split].setdefault(rel[1], [])
            elif len(rel) > 2:
                raise ArchiveError(
                    f"{archive}: nested folder {member.name!r} inside a class folder; not supported"
                )
            continue
        if len(rel) != 3:
            raise ArchiveError(
                f"{archive}: file {member.name!r} is not directly inside a class folder "
                f"(expected {_join(root, split)}/<class>/<image>)"
            )
        if not rel[2].lower().endswith(image_extensions()):
            suffix = posixpath.splitext(rel[2])[1] or "no extension"
            raise ArchiveError(
                f"{archive}: file {member.name!r} is not an image: Pillow reads no {suffix!r} files (it reads "
                f".jpg, .png, .bmp, .webp, .gif, .tiff and {len(image_extensions()) - 6} more); remove it from "
                "the class folder"
            )
        per_split[split].setdefault(rel[1], []).append(member.name)
    for split, classes in per_split.items():
        for cls, names in sorted(classes.items()):
            if not names:
                raise ArchiveError(
                    f"{archive}: class folder {_join(root, f'{split}/{cls}/')!r} has no images"
                )
    class_names = sorted(per_split["train"])
    if not class_names:
        raise ArchiveError(f"{archive}: no class folders under {_join(root, 'train/')!r}")
    unknown = sorted(set(per_split["test"]) - set(class_names))
    if unknown:
        raise ArchiveError(
            f"{archive}: test class folder(s) {[_join(root, f'test/{c}/') for c in unknown]} have no train folder"
        )
    label = {cls: i for i, cls in enumerate(class_names)}
    files = {
        split: [(name, label[cls]) for cls in sorted(classes) for name in sorted(classes[cls])]
        for split, classes in per_split.items()
    }
    return ImageFolderIndex(root=root, class_names=class_names, files=files)
