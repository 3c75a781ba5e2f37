"""The storage API against a real SeaweedFS S3 server: no mock of the S3 API anywhere."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from pathlib import Path

import pytest

from cifar10_kfp.storage import (
    CredentialsError,
    IntegrityError,
    InvalidNameError,
    ObjectNotFound,
    ObjectStore,
    StorageConfig,
    StorageError,
    join_uri,
    parse_uri,
)
from cifar10_kfp.storage.embedded import EmbeddedObjectStore


def _write(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size) if size < 1024 * 1024 else b"")
    if size >= 1024 * 1024:
        with open(path, "wb") as fh:
            block = os.urandom(1024 * 1024)
            for _ in range(size // len(block)):
                fh.write(block)
            fh.write(os.urandom(size % len(block)))
    return path


@pytest.mark.parametrize("size", [0, 1234, 65 * 1024 * 1024 + 17], ids=["empty", "small", "over-64MiB"])
def test_file_round_trip(store_env: ObjectStore, tmp_path, size):
    src = _write(tmp_path / "src.bin", size)
    uri = store_env.root_uri("roundtrip", f"{size}.bin")
    digest = store_env.put_file(src, uri)
    assert digest == hashlib.sha256(src.read_bytes()).hexdigest()
    info = store_env.stat(uri)
    assert (info.size, info.sha256) == (size, digest)
    dst = tmp_path / "out" / "dst.bin"
    assert store_env.get_file(uri, dst) == digest
    assert dst.read_bytes() == src.read_bytes()
    assert not list(dst.parent.glob("*.part")), "temporary download files must not be left behind"


def test_bytes_exists_list_delete(store_env: ObjectStore):
    base = store_env.root_uri("listing")
    for name in ("a.txt", "sub/b.txt", "sub/c.txt"):
        store_env.put_bytes(name.encode(), join_uri(base, name))
    assert store_env.list(base + "/") == [join_uri(base, n) for n in ("a.txt", "sub/b.txt", "sub/c.txt")]
    assert store_env.get_bytes(join_uri(base, "sub/b.txt")) == b"sub/b.txt"
    assert store_env.exists(join_uri(base, "a.txt"))
    store_env.delete(join_uri(base, "a.txt"))
    assert not store_env.exists(join_uri(base, "a.txt"))
    with pytest.raises(ObjectNotFound, match="listing/a.txt"):
        store_env.get_bytes(join_uri(base, "a.txt"))


def test_minio_scheme_is_the_same_object(store_env: ObjectStore):
    uri = store_env.root_uri("scheme.txt")
    store_env.put_bytes(b"same", uri)
    assert store_env.get_bytes(uri.replace("s3://", "minio://", 1)) == b"same"


def test_local_paths_and_file_uris_use_the_same_api(tmp_path):
    store = ObjectStore(StorageConfig())  # no endpoint needed for local work
    store.put_bytes(b"local", tmp_path / "d" / "x.txt")
    assert store.get_bytes(f"file://{tmp_path}/d/x.txt") == b"local"
    assert store.list(str(tmp_path / "d")) == [str(tmp_path / "d" / "x.txt")]
    store.get_file(str(tmp_path / "d" / "x.txt"), tmp_path / "copy.txt")
    assert (tmp_path / "copy.txt").read_bytes() == b"local"


def test_directory_round_trip(store_env: ObjectStore, tmp_path):
    src = tmp_path / "model"
    (src / "nested").mkdir(parents=True)
    (src / "a.json").write_text("{}")
    (src / "nested" / "w.bin").write_bytes(b"\x00\x01")
    uri = store_env.root_uri("dirs", "model")
    store_env.put_dir(src, uri)
    got = store_env.get_dir(uri, tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in got) == ["a.json", "nested/w.bin"]
    assert (tmp_path / "back" / "nested" / "w.bin").read_bytes() == b"\x00\x01"


def test_corrupted_object_is_detected_on_download(store_env: ObjectStore, tmp_path):
    """An object whose content no longer matches its recorded sha256 is refused, and dst is untouched."""
    uri = store_env.root_uri("corrupt.bin")
    loc = parse_uri(uri)
    good = b"the real content"
    recorded = hashlib.sha256(good).hexdigest()
    # Simulate bit rot / tampering: content that differs from the checksum recorded beside it.
    store_env.client.put_object(
        loc.bucket, loc.key, io.BytesIO(b"the real c0ntent"), 16, metadata={"sha256": recorded}
    )
    dst = tmp_path / "dst.bin"
    dst.write_bytes(b"previous")
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        store_env.get_file(uri, dst)
    assert dst.read_bytes() == b"previous"
    assert not list(tmp_path.glob("*.part"))
    with pytest.raises(IntegrityError):
        store_env.get_bytes(uri)


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("s3://Bad_Bucket/key", "Bad_Bucket"),
        ("s3://ab/key", "'ab'"),
        ("s3://192.168.1.1/key", "192.168.1.1"),
        ("s3://a..b/key", "a..b"),
        ("s3://mlpipeline/../etc/passwd", "../etc/passwd"),
        ("s3://mlpipeline/a/../../b", "a/../../b"),
        ("s3://mlpipeline//abs", "/abs"),
        ("s3://mlpipeline/" + "k" * 1025, "1025 bytes"),
        ("s3://mlpipeline/bad\x07key", "control character"),
        ("ftp://host/x", "ftp://host/x"),
    ],
)
def test_bad_names_are_rejected_before_any_request(uri, fragment):
    store = ObjectStore(StorageConfig(endpoint="127.0.0.1:1", access_key="k", secret_key="s"))
    with pytest.raises(InvalidNameError) as err:
        store.put_bytes(b"x", uri)
    assert fragment in str(err.value)
    assert store._client is None, "no client (and so no request) may exist for an invalid name"


def test_wrong_credentials_give_a_clear_error(embedded_store):
    store = embedded_store.store(MINIO_SECRET_KEY="definitely-wrong")
    with pytest.raises(CredentialsError, match="refused the credentials") as err:
        store.get_bytes("s3://mlpipeline/anything")
    assert "definitely-wrong" not in str(err.value)


def test_missing_configuration_is_explained():
    with pytest.raises(StorageError, match="MINIO_ENDPOINT"):
        ObjectStore(StorageConfig()).get_bytes("s3://mlpipeline/x")


def test_outage_retries_then_fails_clearly_and_recovers_after_restart(tmp_path):
    with EmbeddedObjectStore(tmp_path / "s3") as server:
        uri = "s3://mlpipeline/outage/x.txt"
        server.store().put_bytes(b"survives", uri)
        server.stop()

        short = server.store(CIFAR10_KFP_RETRY_BUDGET_S=2)
        started = time.monotonic()
        with pytest.raises(StorageError) as err:
            short.get_bytes(uri)
        elapsed = time.monotonic() - started
        assert 1.5 <= elapsed < 15
        message = str(err.value)
        assert server.endpoint in message and "mlpipeline" in message and "outage/x.txt" in message
        assert "retry budget" in message

        restarter = threading.Timer(2.0, server.start)
        restarter.start()
        try:
            patient = server.store(CIFAR10_KFP_RETRY_BUDGET_S=60)
            assert patient.get_bytes(uri) == b"survives"
        finally:
            restarter.join()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited all the same.
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _weed_processes_for(data_dir: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "weed" in cmdline and str(data_dir) in cmdline:
                pids.append(int(proc.name))
    return pids


def test_two_servers_at_once_and_no_process_left_behind(tmp_path):
    a = EmbeddedObjectStore(tmp_path / "a")
    b = EmbeddedObjectStore(tmp_path / "b")
    with a, b:
        assert set(a.ports.values()).isdisjoint(b.ports.values())
        a.store().put_bytes(b"from a", "s3://mlpipeline/who")
        b.store().put_bytes(b"from b", "s3://mlpipeline/who")
        assert a.store().get_bytes("s3://mlpipeline/who") == b"from a"
        assert b.store().get_bytes("s3://mlpipeline/who") == b"from b"
        pids = [a.pid, b.pid]
        assert all(_pid_alive(p) for p in pids)
    assert not any(_pid_alive(p) for p in pids)
    assert _weed_processes_for(tmp_path) == []


def test_server_is_stopped_when_the_caller_fails(tmp_path):
    server = EmbeddedObjectStore(tmp_path / "s3")
    with pytest.raises(RuntimeError, match="caller failed"), server:
        pid = server.pid
        raise RuntimeError("caller failed")
    assert not _pid_alive(pid)


# /proc/net/tcp{,6} write an address as the hex of each 32-bit word in host (little-endian) byte order.
V6_LOOPBACK = "00000000000000000000000001000000"  # ::1
V4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:a.b.c.d, followed by the IPv4 word


def _is_loopback(table: str, address: str) -> bool:
    if table == "tcp":
        return address[6:8] == "7F"  # 127.0.0.0/8
    return address == V6_LOOPBACK or (address.startswith(V4_MAPPED) and address[-2:] == "7F")


def _listening_sockets() -> list[tuple[str, str, int, str]]:
    """(table, address, port, inode) of every listening TCP socket, IPv4 and IPv6 (dual-stack binds)."""
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A":  # LISTEN
                found.append((table, address, int(port, 16), fields[9]))
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def test_server_binds_loopback_only(embedded_store):
    """Every port the server process listens on, its configured ones and any other, is on loopback.

    A bind to 0.0.0.0 shows in the IPv4 table as 00000000; one to :: (dual-stack, so reachable over
    IPv4 too) only in the IPv6 table: both tables are read.
    """
    ours = _socket_inodes(embedded_store.pid)
    listening = [s for s in _listening_sockets() if s[3] in ours]
    by_port = {port: (table, address) for table, address, port, _ in listening}
    assert embedded_store.ports["s3"] in by_port, f"the S3 port is not listening: {by_port}"
    assert set(embedded_store.ports.values()) <= set(by_port), f"ports {embedded_store.ports} vs {by_port}"
    exposed = [(t, a, p) for t, a, p, _ in listening if not _is_loopback(t, a)]
    assert not exposed, f"the store listens beyond loopback (table, hex address, port): {exposed}"
