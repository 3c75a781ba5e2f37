"""The model registry's rules: names, versions, the latest pointer and resolving what a user names."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from cifar10_kfp.publish.registry import (
    LATEST,
    PublishError,
    latest_version,
    make_version,
    move_latest,
    resolve_published,
    validate_model_name,
)
from cifar10_kfp.storage import join_uri

T0 = datetime(2026, 12, 2, 17, 15, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("name", ["cifar10", "a", "resnet-9.v2_b", "x" * 63])
def test_valid_model_names(name):
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["", "Tiny", "-a", "a-", "a/b", "x" * 64, "a b", None])
def test_invalid_model_names_are_refused_naming_the_value(name):
    with pytest.raises(ValueError, match=f"invalid model_name {name!r}"):
        validate_model_name(name)


def test_versions_sort_by_time_and_keep_runs_apart():
    assert make_version("KFP run/42", T0) == "20261202T171500Z-kfprun42"
    later = make_version("a", T0.replace(second=1))
    assert sorted([later, make_version("b", T0)])[-1] == later
    assert make_version("", T0) != make_version("", T0)  # no run id: a random suffix


def test_latest_never_moves_back_and_a_bad_pointer_is_named(store_env):
    store_env.ensure_bucket()
    base = join_uri(store_env.root_uri(), "models", "reg")
    newer = {"version": make_version("b", T0.replace(minute=20)), "uri": join_uri(base, "v2")}
    older = {"version": make_version("a", T0), "uri": join_uri(base, "v1")}
    assert move_latest(store_env, join_uri(base, LATEST), newer, "reg")
    assert not move_latest(store_env, join_uri(base, LATEST), older, "reg")
    assert latest_version("reg", store=store_env)["version"] == newer["version"]
    assert resolve_published("reg", store=store_env) == newer["uri"]
    assert resolve_published(join_uri(base, LATEST), store=store_env) == newer["uri"]
    store_env.put_bytes(b"[1, 2]", join_uri(base, LATEST))
    with pytest.raises(PublishError, match="latest pointer of 'reg' is malformed"):
        latest_version("reg", store=store_env)


def test_resolve_local_pointer_directory_and_bad_input(tmp_path):
    pointer = tmp_path / "latest"
    pointer.write_text(json.dumps({"version": "v", "uri": "s3://b/p/models/m/v"}))
    assert resolve_published(str(pointer)) == "s3://b/p/models/m/v"
    (tmp_path / "junk").write_text("not json")
    with pytest.raises(ValueError, match="is not a latest pointer"):
        resolve_published(str(tmp_path / "junk"))
    with pytest.raises(FileNotFoundError, match="is not a model directory"):
        resolve_published(str(tmp_path))
    with pytest.raises(ValueError, match="invalid model_name 'No/Such'"):
        resolve_published("No/Such")
