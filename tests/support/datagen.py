"""Test data builders shared by the data, pipeline and reliability tests.

- ``make_official_archive``: a small archive in the exact official CIFAR-10 python layout,
  with Python 2 style pickles (as the real files are), learnable class colours.
- ``make_image_folder_archive``: an image-folder archive from a spec of images.
- ``make_real_subset_archive``: a stratified image-folder subset of the real JPEG archive.
- ``LocalHTTPServer``: a real HTTP server on 127.0.0.1 in a thread, with a request log.
- Malicious and broken archives: ``make_traversal_archive``, ``make_absolute_path_archive``,
  ``make_symlink_escape_archive``, ``make_hardlink_archive``, ``make_device_archive``,
  ``make_bomb_archive``, ``make_corrupt_gzip``, ``make_truncated_gzip``, ``make_corrupt_zip``,
  ``make_truncated_zip``; ``MALICIOUS_BUILDERS`` maps a case name to its builder. Each one is
  otherwise a valid small image-folder dataset, so the bad member is the only reason to reject.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import pickle
import shutil
import struct
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Distinct mean colours per class, so a small model can learn the generated data.
_CLASS_COLOURS = np.array(
    [[200, 60, 60], [60, 200, 60], [60, 60, 200], [200, 200, 60], [200, 60, 200],
     [60, 200, 200], [130, 130, 130], [230, 150, 40], [40, 150, 230], [120, 40, 160]],
    dtype=np.int64,
)  # fmt: skip


def file_digest(path: str | os.PathLike, algo: str = "sha256") -> str:
    digest = hashlib.new(algo)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------- official python layout


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 pickles in the form Python 2's cPickle wrote the official batches.

    Python 2 ``str`` objects (keys, names, the array bytes) are BINSTRING opcodes, and numpy's
    reconstructor is the ``numpy.core.multiarray`` global, exactly what the real files hold.
    """

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str

    def save_global(self, obj, name=None):
        module = getattr(obj, "__module__", None)
        name = name or obj.__qualname__
        if module == "numpy._core.multiarray" or module == "numpy.core.multiarray":
            module = "numpy.core.multiarray"
        elif module and module.startswith("numpy"):
            module = "numpy"
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        self.memoize(obj)


def _py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _official_batch(rng, n: int, label: str, start: int) -> tuple[dict, np.ndarray, np.ndarray]:
    labels = (np.arange(n) + start) % 10
    rng.shuffle(labels)
    images = rng.integers(0, 50, size=(n, 3, 32, 32), dtype=np.int64)
    images += _CLASS_COLOURS[labels][:, :, None, None] - 25
    images = np.clip(images, 0, 255).astype(np.uint8)
    batch = {
        b"batch_label": label.encode(),
        b"labels": [int(x) for x in labels],
        b"data": images.reshape(n, 3072),  # R plane, G plane, B plane per row
        b"filenames": [f"{CIFAR10_CLASSES[c]}_s_{start + i:06d}.png".encode() for i, c in enumerate(labels)],
    }
    return batch, images, labels.astype(np.int64)


def make_official_archive(
    path: str | os.PathLike, n_per_batch: int = 100, seed: int = 0, *, return_arrays: bool = False
):
    """Write ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta,readme.html}`` as .tar.gz.

    Returns the path, or ``(path, arrays)`` with ``arrays = {"train": (images, labels), "test": ...}``
    (images uint8 [N, 3, 32, 32] in archive order) when ``return_arrays``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    train_images, train_labels = [], []
    for i in range(1, 6):
        batch, images, labels = _official_batch(
            rng, n_per_batch, f"training batch {i} of 5", (i - 1) * n_per_batch
        )
        files[f"data_batch_{i}"] = _py2_pickle(batch)
        train_images.append(images)
        train_labels.append(labels)
    batch, test_images, test_labels = _official_batch(rng, n_per_batch, "testing batch 1 of 1", 0)
    files["test_batch"] = _py2_pickle(batch)
    meta = {b"num_cases_per_batch": n_per_batch, b"label_names": [c.encode() for c in CIFAR10_CLASSES]}
    meta[b"num_vis"] = 3072
    files["batches.meta"] = _py2_pickle(meta)
    files["readme.html"] = (
        b"<meta HTTP-EQUIV='REFRESH' content='0; url=http://www.cs.toronto.edu/~kriz/cifar.html'>\n"
    )
    with tarfile.open(path, "w:gz") as tar:
        _add_dir(tar, "cifar-10-batches-py")
        for name in ("data_batch_4", "readme.html", "test_batch", "data_batch_3", "batches.meta"):
            _add_bytes(tar, f"cifar-10-batches-py/{name}", files[name])
        for name in ("data_batch_2", "data_batch_5", "data_batch_1"):
            _add_bytes(tar, f"cifar-10-batches-py/{name}", files[name])
    if return_arrays:
        arrays = {
            "train": (np.concatenate(train_images), np.concatenate(train_labels)),
            "test": (test_images, test_labels),
        }
        return path, arrays
    return path


# ------------------------------------------------------------------- image folders


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
    tar.addfile(info)


def encode_image(array: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    """Encode an H x W (x C) uint8 array as PNG or JPEG bytes."""
    from PIL import Image

    img = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def solid_image(colour, size=(32, 32), fmt: str = "PNG") -> bytes:
    """A solid-colour RGB image (``size`` is width, height)."""
    array = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    array[...] = colour
    return encode_image(array, fmt)


def make_image_folder_archive(
    path: str | os.PathLike,
    files: dict[str, bytes],
    *,
    dirs: tuple[str, ...] = (),
    extra: Callable[[tarfile.TarFile], None] | None = None,
) -> Path:
    """Write ``files`` ({member name: bytes}) and empty ``dirs`` as .tar/.tar.gz/.tgz (by suffix) or .zip."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name in dirs:
                zf.writestr(name.rstrip("/") + "/", b"")
            for name, data in files.items():
                zf.writestr(name, data)
        return path
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    with tarfile.open(path, mode) as tar:
        for name in dirs:
            _add_dir(tar, name.rstrip("/"))
        for name, data in files.items():
            _add_bytes(tar, name, data)
        if extra is not None:
            extra(tar)
    return path


def small_image_folder(root: str = "data", per_class: int = 3, classes=("cat", "dog")) -> dict[str, bytes]:
    """A tiny valid image-folder layout: ``per_class`` solid PNGs per class and split."""
    files = {}
    for split in ("train", "test"):
        for c, cls in enumerate(classes):
            for i in range(per_class):
                files[f"{root}/{split}/{cls}/{i:03d}.png"] = solid_image((40 + 150 * c, 90, 20 * i))
    return files


# ---------------------------------------------------------------- real JPEG subset

_SUBSET_CACHE: dict[tuple, Path] = {}
_SUBSET_DIR: Path | None = None


def make_real_subset_archive(
    real_archive: str | os.PathLike,
    dst: str | os.PathLike,
    train_per_class: int,
    test_per_class: int,
    seed: int = 0,
) -> Path:
    """Write a stratified image-folder .tar.gz subset of the real CIFAR-10 JPEG archive to ``dst``.

    Picks ``train_per_class``/``test_per_class`` random images of every class (seeded). The
    subset is built once per process for given arguments and copied to ``dst`` after that.
    """
    global _SUBSET_DIR
    real_archive = Path(real_archive)
    stat = real_archive.stat()
    key = (str(real_archive), stat.st_size, stat.st_mtime_ns, train_per_class, test_per_class, seed)
    if key not in _SUBSET_CACHE:
        if _SUBSET_DIR is None:
            _SUBSET_DIR = Path(tempfile.mkdtemp(prefix="cifar10-kfp-subsets-"))
            import atexit

            atexit.register(shutil.rmtree, _SUBSET_DIR, True)
        by_class: dict[tuple[str, str], list[tarfile.TarInfo]] = {}
        data: dict[str, bytes] = {}
        with tarfile.open(real_archive, "r|gz") as tar:
            for info in tar:
                parts = info.name.split("/")
                if info.isfile() and len(parts) == 4 and parts[1] in ("train", "test"):
                    by_class.setdefault((parts[1], parts[2]), []).append(info)
                    data[info.name] = tar.extractfile(info).read()
        rng = np.random.default_rng(seed)
        chosen = []
        for (split, _cls), infos in sorted(by_class.items()):
            want = train_per_class if split == "train" else test_per_class
            infos = sorted(infos, key=lambda i: i.name)
            chosen += [infos[i] for i in sorted(rng.permutation(len(infos))[:want])]
        out = _SUBSET_DIR / f"subset-{len(_SUBSET_CACHE)}.tar.gz"
        with tarfile.open(out, "w:gz", compresslevel=1) as tar:
            for info in chosen:
                _add_bytes(tar, info.name, data[info.name])
        _SUBSET_CACHE[key] = out
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_SUBSET_CACHE[key], dst)
    return dst


# ------------------------------------------------------------------- HTTP server


class LocalHTTPServer:
    """A real HTTP server on 127.0.0.1 in a background thread, serving registered routes.

    ``requests`` logs ``(method, path)`` of every request received. Routes: ``add_file``,
    ``add_bytes``; ``add_stall`` (sends headers, then stalls: timeouts); ``add_status`` (an
    HTTP error); ``add_truncated`` (declares more bytes than it sends, then closes).

    Use as a context manager, or call ``start()``/``stop()``.
    """

    def __init__(self):
        self.routes: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._stop_stalls = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - http.server API
                with outer._lock:
                    outer.requests.append(("GET", self.path))
                route = outer.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(404, "not found")
                    return
                route(self)

            def log_message(self, *args):  # keep test output clean
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def fetches(self, path: str) -> int:
        """How many GET requests reached ``path``."""
        with self._lock:
            return sum(
                1
                for method, p in self.requests
                if method == "GET" and p.split("?")[0] == f"/{path.lstrip('/')}"
            )

    def add_bytes(self, path: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        def route(handler):
            handler.send_response(200)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)

        self.routes[f"/{path.lstrip('/')}"] = route
        return self.url(path)

    def add_file(self, path: str, file: str | os.PathLike) -> str:
        return self.add_bytes(path, Path(file).read_bytes())

    def add_status(self, path: str, status: int) -> str:
        self.routes[f"/{path.lstrip('/')}"] = lambda handler: handler.send_error(status)
        return self.url(path)

    def add_stall(self, path: str, seconds: float = 30.0) -> str:
        def route(handler):
            handler.send_response(200)
            handler.send_header("Content-Length", "1000")
            handler.end_headers()
            handler.wfile.write(b"x" * 10)
            handler.wfile.flush()
            self._stop_stalls.wait(seconds)

        self.routes[f"/{path.lstrip('/')}"] = route
        return self.url(path)

    def add_truncated(self, path: str, data: bytes, declared: int) -> str:
        def route(handler):
            handler.send_response(200)
            handler.send_header("Content-Length", str(declared))
            handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
            handler.close_connection = True

        self.routes[f"/{path.lstrip('/')}"] = route
        return self.url(path)

    def start(self) -> LocalHTTPServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop_stalls.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LocalHTTPServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def closed_port_url(path: str = "cifar-10-python.tar.gz") -> str:
    """A URL on 127.0.0.1 where nothing listens: a download fails like it does without a network."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    time.sleep(0.01)
    return f"http://127.0.0.1:{port}/{path}"


# ------------------------------------------------------- malicious and broken archives
# Each builder writes a small, otherwise valid image-folder archive plus one bad member and
# returns (path, name of the bad member as it should appear in the error).


def _tar_with(path: Path, add_bad: Callable[[tarfile.TarFile], None]) -> Path:
    return make_image_folder_archive(path, small_image_folder(), extra=add_bad)


def make_traversal_archive(path: str | os.PathLike, *, kind: str = "tar") -> tuple[Path, str]:
    """A member named ``data/../../evil.txt``."""
    bad = "data/../../evil.txt"
    path = Path(path)
    if kind == "zip":
        files = small_image_folder()
        files[bad] = b"owned"
        return make_image_folder_archive(path.with_suffix(".zip"), files), bad
    return _tar_with(path, lambda tar: _add_bytes(tar, bad, b"owned")), bad


def make_absolute_path_archive(path: str | os.PathLike, *, kind: str = "tar") -> tuple[Path, str]:
    """A member named ``/tmp/evil.txt``."""
    bad = "/tmp/cifar10-kfp-evil.txt"
    path = Path(path)
    if kind == "zip":
        # zipfile strips a leading '/' when writing, so write the header name by hand.
        path = path.with_suffix(".zip")
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in small_image_folder().items():
                zf.writestr(name, data)
            info = zipfile.ZipInfo("tmp/cifar10-kfp-evil.txt")
            zf.writestr(info, b"owned")
        raw = path.read_bytes().replace(b"tmp/cifar10-kfp-evil.txt", b"/tmp/cifar10-kfp-evil.tx")
        path.write_bytes(raw)
        return path, "/tmp/cifar10-kfp-evil.tx"
    return _tar_with(path, lambda tar: _add_bytes(tar, bad, b"owned")), bad


def make_symlink_escape_archive(path: str | os.PathLike, *, kind: str = "tar") -> tuple[Path, str]:
    """A symlink ``data/train/cat/link.png`` pointing at ``../../../../etc/passwd``."""
    bad = "data/train/cat/link.png"
    target = "../../../../etc/passwd"
    path = Path(path)
    if kind == "zip":
        path = path.with_suffix(".zip")
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in small_image_folder().items():
                zf.writestr(name, data)
            info = zipfile.ZipInfo(bad)
            info.create_system = 3
            info.external_attr = 0o120777 << 16  # S_IFLNK | 0777
            zf.writestr(info, target)
        return path, bad

    def add(tar):
        info = tarfile.TarInfo(bad)
        info.type, info.linkname = tarfile.SYMTYPE, target
        tar.addfile(info)

    return _tar_with(path, add), bad


def make_hardlink_archive(path: str | os.PathLike) -> tuple[Path, str]:
    """A hard link ``data/train/cat/hard.png`` to an image inside the archive (hard links are refused)."""
    bad = "data/train/cat/hard.png"

    def add(tar):
        info = tarfile.TarInfo(bad)
        info.type, info.linkname = tarfile.LNKTYPE, "data/train/cat/000.png"
        tar.addfile(info)

    return _tar_with(Path(path), add), bad


def make_device_archive(path: str | os.PathLike, *, kind: str = "chr") -> tuple[Path, str]:
    """A character device (``kind="chr"``), block device (``"blk"``) or fifo (``"fifo"``) member."""
    bad = f"data/train/cat/{kind}-device"
    types = {"chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}

    def add(tar):
        info = tarfile.TarInfo(bad)
        info.type = types[kind]
        info.devmajor, info.devminor = (1, 3) if kind != "fifo" else (0, 0)
        tar.addfile(info)

    return _tar_with(Path(path), add), bad


def make_bomb_archive(
    path: str | os.PathLike, size: int = 64 * 1024 * 1024, *, kind: str = "tar"
) -> tuple[Path, str]:
    """A member of ``size`` zero bytes that compresses to almost nothing; test it with a smaller cap."""
    bad = "data/train/cat/bomb.png"
    path = Path(path)
    if kind == "zip":
        path = path.with_suffix(".zip")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in small_image_folder().items():
                zf.writestr(name, data)
            with zf.open(bad, "w", force_zip64=True) as fh:
                block = bytes(1 << 20)
                for _ in range(size // len(block)):
                    fh.write(block)
        return path, bad

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, buf):
            n = min(len(buf), self.left)
            buf[:n] = bytes(n)
            self.left -= n
            return n

    def add(tar):
        info = tarfile.TarInfo(bad)
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(size)))

    return _tar_with(path, add), bad


def _valid_tar_gz(path: Path) -> Path:
    files = small_image_folder(per_class=8)
    # Incompressible content, so damage lands in deflate data and not only in the tar padding.
    rng = np.random.default_rng(0)
    files["data/train/cat/noise.png"] = encode_image(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    return make_image_folder_archive(path, files)


def make_corrupt_gzip(path: str | os.PathLike) -> tuple[Path, str]:
    """A .tar.gz with bytes flipped in the middle of the compressed data."""
    path = _valid_tar_gz(Path(path))
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    for i in range(middle, middle + 64):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path, ""


def make_truncated_gzip(path: str | os.PathLike) -> tuple[Path, str]:
    """A .tar.gz cut off at 60 percent."""
    path = _valid_tar_gz(Path(path))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) * 6 // 10])
    return path, ""


def make_bad_crc_gzip(path: str | os.PathLike) -> tuple[Path, str]:
    """A .tar.gz whose deflate data is intact but whose trailer CRC is wrong."""
    path = _valid_tar_gz(Path(path))
    raw = bytearray(path.read_bytes())
    raw[-8] ^= 0xFF
    path.write_bytes(bytes(raw))
    return path, ""


def make_corrupt_zip(path: str | os.PathLike) -> tuple[Path, str]:
    """A .zip with bytes flipped inside one member's compressed data (CRC or inflate error)."""
    path = Path(path).with_suffix(".zip")
    rng = np.random.default_rng(0)
    files = small_image_folder()
    victim = "data/train/cat/noise.png"
    files[victim] = encode_image(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    make_image_folder_archive(path, files)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(victim)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
    for i in range(start, start + 32):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path, victim


def make_truncated_zip(path: str | os.PathLike) -> tuple[Path, str]:
    """A .zip cut off at 60 percent (no central directory)."""
    path = Path(path).with_suffix(".zip")
    make_image_folder_archive(path, small_image_folder(per_class=6))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) * 6 // 10])
    return path, ""


# case name -> builder(path) -> (path, bad member name or "" when the damage has no member name)
MALICIOUS_BUILDERS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "path-traversal": make_traversal_archive,
    "path-traversal-zip": lambda p: make_traversal_archive(p, kind="zip"),
    "absolute-path": make_absolute_path_archive,
    "absolute-path-zip": lambda p: make_absolute_path_archive(p, kind="zip"),
    "symlink-escape": make_symlink_escape_archive,
    "symlink-escape-zip": lambda p: make_symlink_escape_archive(p, kind="zip"),
    "hard-link": make_hardlink_archive,
    "char-device": make_device_archive,
    "block-device": lambda p: make_device_archive(p, kind="blk"),
    "fifo": lambda p: make_device_archive(p, kind="fifo"),
    "bomb": lambda p: make_bomb_archive(p, 8 * 1024 * 1024),
    "bomb-zip": lambda p: make_bomb_archive(p, 8 * 1024 * 1024, kind="zip"),
    "corrupt-gzip": make_corrupt_gzip,
    "truncated-gzip": make_truncated_gzip,
    "bad-crc-gzip": make_bad_crc_gzip,
    "corrupt-zip": make_corrupt_zip,
    "truncated-zip": make_truncated_zip,
}
BOMB_TEST_CAP = 4 * 1024 * 1024  # CIFAR10_KFP_MAX_EXTRACT_BYTES to use with the "bomb" cases
# case name -> what the ArchiveError that refuses it must say, besides the member name.
REJECTION_REASONS = {
    "path-traversal": "'..' path segment",
    "path-traversal-zip": "'..' path segment",
    "absolute-path": "absolute path",
    "absolute-path-zip": "absolute path",
    "symlink-escape": "points outside the archive",
    "symlink-escape-zip": "points outside the archive",
    "hard-link": "hard link",
    "char-device": "device, fifo",
    "block-device": "device, fifo",
    "fifo": "device, fifo",
    "bomb": "past the cap",
    "bomb-zip": "past the cap",
    "corrupt-gzip": "corrupt or truncated",
    "truncated-gzip": "corrupt or truncated",
    "bad-crc-gzip": "CRC",
    "corrupt-zip": "corrupt or truncated zip member",
    "truncated-zip": "corrupt or truncated zip",
}
