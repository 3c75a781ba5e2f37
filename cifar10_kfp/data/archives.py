"""Safe reading of untrusted tar and zip archives, straight from the compressed stream.

Dataset archives come from the internet or from users, so every member is checked before
its content is used: no absolute paths, no ``..`` segments, no hard links, no device, fifo
or socket members, no symlink that points outside the archive, no duplicate names, and a
cap on the total extracted size and on the member count (decompression bombs). Corrupt or
truncated gzip/bz2/xz/zip data is an error, including a wrong gzip CRC at the very end.
Every error names the archive and the member.

Nothing is extracted to disk: ``iter_archive`` yields member contents as bytes, which is
both safer and faster for datasets of many small images. ``extract_archive`` exists for
callers that need files, and writes only what ``iter_archive`` accepted.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cifar10_kfp.env_settings import env_number

_CHUNK = 1024 * 1024
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(ValueError):
    """The archive is unsafe, corrupt, truncated or not in a supported layout. The message names the member."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps that stop decompression bombs; the defaults fit CIFAR-10 (178 MB) with a wide margin."""

    max_total_bytes: int = 8 * 1024**3  # sum of extracted member sizes (CIFAR10_KFP_MAX_EXTRACT_BYTES)
    max_members: int = (
        2_000_000  # entries of any kind; CIFAR-10 as images has ~60,000 (CIFAR10_KFP_MAX_MEMBERS)
    )
    max_member_bytes: int = 1024**3  # one member read into memory (an official batch is 31 MB)

    @classmethod
    def from_env(cls) -> ArchiveLimits:
        return cls(
            max_total_bytes=env_number("CIFAR10_KFP_MAX_EXTRACT_BYTES", cls.max_total_bytes, kind=int),
            max_members=env_number("CIFAR10_KFP_MAX_MEMBERS", cls.max_members, kind=int),
        )


@dataclass(frozen=True)
class ArchiveMember:
    """One accepted member: a normalized relative POSIX name, its kind and its size in bytes."""

    name: str
    kind: str  # "file", "dir" or "symlink" (symlinks are validated but never followed)
    size: int


def safe_member_name(archive: str, name: str, *, allow_root: bool = False) -> str:
    """Normalize a member name, or raise ArchiveError if it could escape the extraction root.

    ``allow_root`` accepts a name that is the root itself (``./``, as ``tar -C dir .`` writes
    for its first directory entry) and returns ``""`` for it.
    """
    if not name or "\x00" in name or any(ord(ch) < 32 for ch in name):
        raise ArchiveError(f"{archive}: member {name!r} has an empty name or a control character")
    unified = name.replace("\\", "/")  # a backslash is a separator on Windows, so check it as one
    if unified.startswith("/") or _WINDOWS_DRIVE.match(unified):
        raise ArchiveError(f"{archive}: member {name!r} has an absolute path")
    parts = [p for p in unified.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{archive}: member {name!r} contains a '..' path segment")
    if not parts:
        if allow_root:
            return ""
        raise ArchiveError(f"{archive}: member {name!r} names the archive root itself")
    return "/".join(parts)


def _check_link_target(archive: str, name: str, target: str) -> None:
    unified = target.replace("\\", "/")
    if "\x00" in target or not unified or unified.startswith("/") or _WINDOWS_DRIVE.match(unified):
        raise ArchiveError(f"{archive}: symlink member {name!r} points outside the archive (to {target!r})")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), unified))
    if resolved == ".." or resolved.startswith("../"):
        raise ArchiveError(f"{archive}: symlink member {name!r} points outside the archive (to {target!r})")


def archive_kind(path: str | os.PathLike) -> str:
    """``"zip"`` or ``"tar"`` (plain, gzip, bz2 or xz), from the magic bytes rather than the file name."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
        return "tar"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    raise ArchiveError(
        f"{path}: not a supported archive (expected .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz or .zip); "
        f"it starts with {head[:8]!r}"
    )


def _open_decompressed(path: str | os.PathLike):
    """A file object over the decompressed tar stream; gzip/bz2/xz verify their checksums at EOF."""
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if head[:3] == b"BZh":
        return bz2.open(path, "rb")
    if head[:6] == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return open(path, "rb")


class _Budget:
    """Counts members and extracted bytes against the limits."""

    def __init__(self, archive: str, limits: ArchiveLimits):
        self.archive, self.limits = archive, limits
        self.members = 0
        self.total = 0
        self.names: set[str] = set()

    def admit(self, name: str, size: int) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise ArchiveError(
                f"{self.archive}: more than {self.limits.max_members} members (at {name!r}); "
                "raise CIFAR10_KFP_MAX_MEMBERS if this archive is legitimate"
            )
        if name in self.names:
            raise ArchiveError(
                f"{self.archive}: member {name!r} appears twice; refusing an ambiguous archive"
            )
        self.names.add(name)
        self.add_bytes(name, size)

    def add_bytes(self, name: str, size: int) -> None:
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise ArchiveError(
                f"{self.archive}: member {name!r} takes the extracted size past the cap of "
                f"{self.limits.max_total_bytes} bytes (a decompression bomb, or a dataset bigger than allowed: "
                "raise CIFAR10_KFP_MAX_EXTRACT_BYTES if it is legitimate)"
            )


def _read_stream(archive: str, name: str, fh, size: int, keep: bool, limits: ArchiveLimits) -> bytes | None:
    """Read a member's data fully (this is what verifies it); return it only if ``keep``."""
    if keep and size > limits.max_member_bytes:
        raise ArchiveError(
            f"{archive}: member {name!r} is {size} bytes, over the {limits.max_member_bytes} limit"
        )
    chunks: list[bytes] = []
    got = 0
    while True:
        block = fh.read(min(_CHUNK, size - got + 1))
        if not block:
            break
        got += len(block)
        if got > size:
            raise ArchiveError(f"{archive}: member {name!r} holds more data than its declared {size} bytes")
        if keep:
            chunks.append(block)
    if got != size:
        raise ArchiveError(f"{archive}: member {name!r} is truncated ({got} of {size} bytes)")
    return b"".join(chunks) if keep else None


def _iter_tar(path: Path, select, limits: ArchiveLimits) -> Iterator[tuple[ArchiveMember, bytes | None]]:
    archive = str(path)
    budget = _Budget(archive, limits)
    current = "(archive header)"
    raw = _open_decompressed(path)
    try:
        with raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for info in tar:
                current = info.name
                name = safe_member_name(archive, info.name, allow_root=info.isdir())
                if not name:
                    continue  # the "./" entry of `tar -C dir .`
                if info.islnk():
                    raise ArchiveError(
                        f"{archive}: member {info.name!r} is a hard link (to {info.linkname!r}); not allowed"
                    )
                if (
                    info.ischr()
                    or info.isblk()
                    or info.isfifo()
                    or not (info.isfile() or info.isdir() or info.issym())
                ):
                    raise ArchiveError(
                        f"{archive}: member {info.name!r} is a device, fifo or other special file; not allowed"
                    )
                if info.issym():
                    _check_link_target(archive, name, info.linkname)
                    budget.admit(name, 0)
                    yield ArchiveMember(name, "symlink", 0), None
                elif info.isdir():
                    budget.admit(name, 0)
                    yield ArchiveMember(name, "dir", 0), None
                else:
                    budget.admit(name, info.size)
                    keep = bool(select and select(name))
                    data = _read_stream(archive, name, tar.extractfile(info), info.size, keep, limits)
                    yield ArchiveMember(name, "file", info.size), data
            current = "(end of archive)"
            # Read to the end of the compressed stream: that is where gzip/bz2/xz check their CRC,
            # and trailing data counts against the size cap too.
            while True:
                block = raw.read(_CHUNK)
                if not block:
                    break
                budget.add_bytes("(data after the end of the tar archive)", len(block))
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as exc:
        raise ArchiveError(
            f"{archive}: corrupt or truncated archive at member {current!r}: {type(exc).__name__}: {exc}"
        ) from exc


def _zip_mode(info: zipfile.ZipInfo) -> int:
    return (info.external_attr >> 16) & 0xFFFF if info.create_system == 3 else 0


def _iter_zip(path: Path, select, limits: ArchiveLimits) -> Iterator[tuple[ArchiveMember, bytes | None]]:
    archive = str(path)
    budget = _Budget(archive, limits)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ArchiveError(f"{archive}: corrupt or truncated zip archive: {exc}") from exc
    with zf:
        for info in zf.infolist():
            name = safe_member_name(archive, info.filename, allow_root=info.is_dir())
            if not name:
                continue
            mode = _zip_mode(info)
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                raise ArchiveError(
                    f"{archive}: member {info.filename!r} is a device, fifo or socket; not allowed"
                )
            if info.flag_bits & 0x1:
                raise ArchiveError(f"{archive}: member {info.filename!r} is encrypted; not supported")
            try:
                if stat.S_ISLNK(mode):
                    if info.file_size > 4096:
                        raise ArchiveError(
                            f"{archive}: symlink member {info.filename!r} has an oversized target"
                        )
                    with zf.open(info) as fh:
                        target = fh.read(4097).decode("utf-8", "replace")
                    _check_link_target(archive, name, target)
                    budget.admit(name, 0)
                    yield ArchiveMember(name, "symlink", 0), None
                elif info.is_dir():
                    budget.admit(name, 0)
                    yield ArchiveMember(name, "dir", 0), None
                else:
                    budget.admit(name, info.file_size)
                    keep = bool(select and select(name))
                    with zf.open(info) as fh:
                        data = _read_stream(archive, name, fh, info.file_size, keep, limits)
                    yield ArchiveMember(name, "file", info.file_size), data
            except ArchiveError:
                raise
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error, lzma.LZMAError, ValueError) as exc:
                raise ArchiveError(
                    f"{archive}: corrupt or truncated zip member {info.filename!r}: {type(exc).__name__}: {exc}"
                ) from exc


def iter_archive(
    path: str | os.PathLike,
    *,
    select: Callable[[str], bool] | None = None,
    limits: ArchiveLimits | None = None,
) -> Iterator[tuple[ArchiveMember, bytes | None]]:
    """Yield ``(member, data)`` for every member, in archive order, after checking it.

    Every regular file's data is read (that is what detects corruption); it is returned only
    when ``select(name)`` is true, else ``data`` is None. Raises ArchiveError on the first
    unsafe, corrupt or over-limit member, naming it.
    """
    path = Path(path)
    limits = limits or ArchiveLimits.from_env()
    if archive_kind(path) == "zip":
        yield from _iter_zip(path, select, limits)
    else:
        yield from _iter_tar(path, select, limits)


def scan_archive(path: str | os.PathLike, *, limits: ArchiveLimits | None = None) -> list[ArchiveMember]:
    """Check every member and all data of an archive; return the member list."""
    return [member for member, _ in iter_archive(path, limits=limits)]


def extract_archive(
    path: str | os.PathLike, dest: str | os.PathLike, *, limits: ArchiveLimits | None = None
) -> list[Path]:
    """Extract regular files and directories below ``dest`` (symlinks are skipped); returns the files.

    The archive is fully verified first, so a rejected archive leaves nothing behind.
    """
    scan_archive(path, limits=limits)
    dest = Path(dest).resolve()
    written = []
    for member, data in iter_archive(path, select=lambda _name: True, limits=limits):
        target = (dest / member.name).resolve()
        if target != dest and dest not in target.parents:  # defence in depth; names are already checked
            raise ArchiveError(f"{path}: member {member.name!r} would land outside {dest}")
        if member.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif member.kind == "file":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data or b"")
            written.append(target)
    return written
