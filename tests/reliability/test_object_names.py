"""Part 9, object names: hostile keys and bucket names are rejected before any request is sent.

The "server" here is a real TCP listener that counts connections; a name check that happened
after the request (or a retry loop that tried anyway) would show up as a connection.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cifar10_kfp.storage import InvalidNameError, ObjectStore, StorageConfig, parse_uri
from tests.reliability.harness import ConnectionCounter

pytestmark = pytest.mark.reliability

KIND = "object names (keys, buckets)"


@pytest.fixture(scope="module")
def counter():
    listener = ConnectionCounter()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def names_store(counter, rel_creds, tmp_path_factory):
    config = StorageConfig(
        endpoint=counter.endpoint,
        access_key=rel_creds.access_key,
        secret_key=rel_creds.secret_key,
        retry_budget_s=0.5,
    )
    scratch = tmp_path_factory.mktemp("names")
    (scratch / "dir").mkdir()
    (scratch / "dir" / "f.bin").write_bytes(b"payload")
    return ObjectStore(config), scratch


OPERATIONS = {
    "put_bytes": lambda s, uri, d: s.put_bytes(b"x", uri),
    "put_file": lambda s, uri, d: s.put_file(d / "dir" / "f.bin", uri),
    "put_dir": lambda s, uri, d: s.put_dir(d / "dir", uri),
    "get_bytes": lambda s, uri, d: s.get_bytes(uri),
    "get_file": lambda s, uri, d: s.get_file(uri, d / "out.bin"),
    "get_dir": lambda s, uri, d: s.get_dir(uri, d / "out"),
    "stat": lambda s, uri, d: s.stat(uri),
    "exists": lambda s, uri, d: s.exists(uri),
    "list": lambda s, uri, d: s.list(uri),
    "delete": lambda s, uri, d: s.delete(uri),
}


def _assert_rejected_everywhere(
    store: ObjectStore, scratch: Path, counter: ConnectionCounter, uri: str, figures
):
    """Every storage call refuses ``uri`` with InvalidNameError, and no connection is made."""
    before = counter.count
    accepted = []
    for name, op in OPERATIONS.items():
        try:
            op(store, uri, scratch)
            accepted.append(name)
        except InvalidNameError:
            pass
        except Exception as exc:  # noqa: BLE001 - anything but a name error means the name got through
            accepted.append(f"{name} ({type(exc).__name__})")
    connected = counter.count != before
    figures.record_rejection(KIND, not accepted and not connected)
    assert not accepted, f"{uri[:120]!r} was not rejected as an invalid name by {accepted}"
    assert not connected, f"a request reached the server for {uri[:120]!r}"
    assert not (scratch / "out.bin").exists()


# ------------------------------------------------------------------- strategies

SAFE_SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
SAFE_KEY = st.lists(SAFE_SEGMENT, min_size=1, max_size=5).map("/".join)


@st.composite
def dotdot_keys(draw):
    parts = draw(st.lists(SAFE_SEGMENT, min_size=0, max_size=4))
    parts.insert(draw(st.integers(0, len(parts))), "..")
    return "/".join(parts)


@st.composite
def leading_slash_keys(draw):
    return "/" * draw(st.integers(1, 3)) + draw(SAFE_KEY)


@st.composite
def overlong_keys(draw):
    unit = draw(st.sampled_from(["a", "é", "東", "🙂"]))  # 1, 2, 3 and 4 bytes in UTF-8
    limit = 1024 // len(unit.encode()) + 1
    return unit * draw(st.integers(limit, limit + 200))


# Every character of Unicode category Cc: C0 (0-31), DEL (127) and C1 (128-159).
CONTROL_CHARS = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]


@st.composite
def control_char_keys(draw):
    key = draw(SAFE_KEY)
    at = draw(st.integers(0, len(key)))
    return key[:at] + draw(st.sampled_from(CONTROL_CHARS)) + key[at:]


@st.composite
def invalid_buckets(draw):
    """Bucket names that break the S3 rules, one rule at a time."""
    base = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=3, max_size=20))
    kind = draw(
        st.sampled_from(
            ["upper", "short", "long", "underscore", "ip", "edge", "adjacent", "xn", "alias", "empty"]
        )
    )
    if kind == "upper":
        at = draw(st.integers(0, len(base) - 1))
        return base[:at] + base[at].upper().replace(base[at], "A") + base[at + 1 :]
    if kind == "short":
        return base[: draw(st.integers(1, 2))]
    if kind == "long":
        return (base * 64)[: draw(st.integers(64, 100))]
    if kind == "underscore":
        return base[:1] + "_" + base[1:]
    if kind == "ip":
        return ".".join(str(draw(st.integers(0, 255))) for _ in range(4))
    if kind == "edge":
        char = draw(st.sampled_from("-."))
        return char + base if draw(st.booleans()) else base + char
    if kind == "adjacent":
        return base[:1] + draw(st.sampled_from(["..", ".-", "-."])) + base[1:]
    if kind == "xn":
        return "xn--" + base
    if kind == "alias":
        return base + "-s3alias"
    return ""


FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize(
    "strategy",
    [dotdot_keys(), leading_slash_keys(), overlong_keys(), control_char_keys()],
    ids=["dotdot", "leading-slash", "over-1024-bytes", "control-char"],
)
def test_hostile_keys_are_rejected_before_any_request(strategy, names_store, counter, figures):
    store, scratch = names_store

    @FUZZ
    @given(key=strategy)
    def check(key):
        _assert_rejected_everywhere(store, scratch, counter, f"s3://mlpipeline/{key}", figures)
        _assert_rejected_everywhere(store, scratch, counter, f"minio://mlpipeline/{key}", figures)

    check()


@pytest.mark.parametrize("block", ["C0", "DEL", "C1"])
def test_every_control_character_is_rejected(block, names_store, counter, figures):
    """All 65 characters of Unicode category Cc, each in the middle of a key, not just a sample."""
    store, scratch = names_store
    chars = {"C0": CONTROL_CHARS[:32], "DEL": ["\x7f"], "C1": CONTROL_CHARS[33:]}[block]
    assert len(CONTROL_CHARS) == 65 and all(unicodedata.category(c) == "Cc" for c in chars)
    for char in chars:
        _assert_rejected_everywhere(store, scratch, counter, f"s3://mlpipeline/data/a{char}b.bin", figures)


def test_invalid_buckets_are_rejected_before_any_request(names_store, counter, figures):
    store, scratch = names_store

    @FUZZ
    @given(bucket=invalid_buckets(), key=SAFE_KEY)
    def check(bucket, key):
        _assert_rejected_everywhere(store, scratch, counter, f"s3://{bucket}/{key}", figures)

    check()


def test_valid_names_pass_the_same_checks(figures):
    """The other direction: ordinary names are accepted, so the rejections above mean something."""

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(key=SAFE_KEY, bucket=st.sampled_from(["mlpipeline", "my-bucket", "a1.b2.c3", "abc"]))
    def check(key, bucket):
        location = parse_uri(f"s3://{bucket}/{key}")
        assert (location.bucket, location.key) == (bucket, key)
        figures.input(KIND).accepted_valid += 1

    check()


def test_checkpoint_and_model_locations_go_through_the_same_checks(names_store, counter, figures):
    """Locations built from user input (checkpoint URI, model directory) are refused the same way."""
    from cifar10_kfp.train.checkpoint import CheckpointManager
    from cifar10_kfp.train.models import load_model

    store, scratch = names_store
    before = counter.count
    attempts = {
        "checkpoint prefix with '..'": lambda: CheckpointManager(
            "s3://mlpipeline/a/../../etc", store=store
        ).load_latest(),
        "checkpoint prefix with control char": lambda: CheckpointManager(
            "s3://mlpipeline/ck\x00pt", store=store
        ).save({}, epoch=1, step=1),
        "model dir with leading '/'": lambda: load_model("s3://mlpipeline//etc/model"),
        "model dir in a bad bucket": lambda: load_model("s3://Not_A_Bucket/model"),
    }
    for what, attempt in attempts.items():
        rejected = False
        try:
            attempt()
        except InvalidNameError:
            rejected = True
        figures.record_rejection(KIND, rejected)
        assert rejected, f"{what} was not rejected"
    assert counter.count == before
