"""model-registry:// URIs, registry URLs and the token's sources (no server needed)."""

from __future__ import annotations

import pytest

from cifar10_kfp.publish import kubeflow_registry as kr


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("model-registry://cifar10", ("cifar10", None)),
        ("model-registry://cifar10/20260101T000000Z-ab", ("cifar10", "20260101T000000Z-ab")),
    ],
)
def test_parse_registry_uri(uri, expected):
    assert kr.parse_registry_uri(uri) == expected


@pytest.mark.parametrize(
    "uri", ["model-registry://", "model-registry://a/b/c", "model-registry://a//b", "s3://a/b"]
)
def test_parse_registry_uri_refuses(uri):
    with pytest.raises(ValueError, match="registry URI"):
        kr.parse_registry_uri(uri)


@pytest.mark.parametrize("url", ["model-registry:8080", "ftp://h", "http://h/api", "http://u:p@h:8080"])
def test_registry_url_refuses(url):
    with pytest.raises(ValueError, match="URL"):
        kr.registry_url(url)


def test_registry_url_from_env(monkeypatch):
    monkeypatch.setenv(kr.URL_ENV, "http://127.0.0.1:8080/")
    assert kr.registry_url() == "http://127.0.0.1:8080"
    monkeypatch.delenv(kr.URL_ENV)
    with pytest.raises(ValueError, match=kr.URL_ENV):
        kr.registry_url()


def test_token_sources_in_order(tmp_path):
    path_token, sa_token = tmp_path / "path", tmp_path / "sa"
    path_token.write_text("from-path\n")
    sa_token.write_text("from-sa\n")
    env = {kr.TOKEN_ENV: "from-env", kr.TOKEN_PATH_ENV: str(path_token)}
    assert kr.resolve_token(env, str(sa_token)) == "from-env"
    assert kr.resolve_token({kr.TOKEN_PATH_ENV: str(path_token)}, str(sa_token)) == "from-path"
    assert kr.resolve_token({}, str(sa_token)) == "from-sa"
    assert kr.resolve_token({}, str(tmp_path / "missing")) is None
