"""Logging in to multi-user Kubeflow: what the real kfp.Client sends, recorded by a KFP API stand-in
(tests/support/kfp_fake_server.py). The token never shows up in output or logs.

The refusals (no credentials, a rejected token, another profile's token) are answered by the real
multi-user API server and kube-apiserver in tests/cluster/test_multi_user.py, not here."""

from __future__ import annotations

import pytest

from cifar10_kfp_pipelines.cli import main
from cifar10_kfp_pipelines.kfp_client import IN_CLUSTER_HOST, Login
from tests.support.kfp_fake_server import KfpFakeServer

TOKEN = "eyJhbGciOiJSUzI1NiJ9.team-a-editor.c2lnbmF0dXJl"  # shaped like a service-account JWT, not a real one
COOKIE = "oauth2_proxy_kubeflow=c2Vzc2lvbi1mb3ItdGVhbS1h"


@pytest.fixture(autouse=True)
def no_ambient_login(monkeypatch, tmp_path):
    """Neither this machine's environment nor a token file may log the tests in."""
    for name in (
        "KF_PIPELINES_TOKEN",
        "KF_PIPELINES_COOKIES",
        "KF_PIPELINES_ENDPOINT",
        "KUBERNETES_SERVICE_HOST",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "no-token-here"))


@pytest.fixture
def multi_user():
    with KfpFakeServer(token=TOKEN, session_cookie=COOKIE) as server:
        yield server


def _bearers(server) -> set[str | None]:
    return {r.headers.get("authorization") for r in server.requests() if not r.path.endswith("/healthz")}


def test_submit_with_token_flag_sends_the_bearer_on_every_call(multi_user, capsys):
    rc = main(["submit", "--host", multi_user.url, "--namespace", "team-a", "--token", TOKEN,
               "--image", "registry.example/c:1"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert len(multi_user.state.runs) == 1
    assert _bearers(multi_user) == {f"Bearer {TOKEN}"}
    assert TOKEN not in out + err


def test_runs_with_the_token_from_the_environment(multi_user, monkeypatch, capsys):
    multi_user.add_run("nightly")
    monkeypatch.setenv("KF_PIPELINES_TOKEN", TOKEN)
    monkeypatch.setenv("KF_PIPELINES_ENDPOINT", multi_user.url)
    assert main(["runs", "--namespace", "team-a"]) == 0
    assert "nightly" in capsys.readouterr().out
    assert _bearers(multi_user) == {f"Bearer {TOKEN}"}


def test_session_cookies_of_a_gateway_login(multi_user, monkeypatch, capsys):
    multi_user.add_run("from the browser session")
    assert main(["runs", "--host", multi_user.url, "--cookies", COOKIE]) == 0
    assert "from the browser session" in capsys.readouterr().out
    cookies = {r.headers.get("cookie") for r in multi_user.requests() if not r.path.endswith("/healthz")}
    assert cookies == {COOKIE}


def test_in_cluster_the_service_account_token_is_read_and_reread(multi_user, monkeypatch, tmp_path, capsys):
    """kfp's ServiceAccountTokenVolumeCredentials re-reads the projected token, which the kubelet rotates."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))
    monkeypatch.setenv("KF_PIPELINES_ENDPOINT", multi_user.url)
    multi_user.add_run("scheduled from a notebook")
    assert main(["runs", "--namespace", "team-a"]) == 0
    assert "scheduled from a notebook" in capsys.readouterr().out
    rotated = "eyJhbGciOiJSUzI1NiJ9.rotated.c2lnbmF0dXJl"
    token_file.write_text(rotated)
    multi_user.state.token = rotated
    assert main(["runs", "--namespace", "team-a"]) == 0
    assert f"Bearer {rotated}" in _bearers(multi_user)


def test_login_resolution_order_and_defaults(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("sa-token")
    env = {"KF_PIPELINES_SA_TOKEN_PATH": str(token_file), "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    in_cluster = Login.resolve(env=env)
    assert (in_cluster.host, in_cluster.token_path, in_cluster.token) == (
        IN_CLUSTER_HOST,
        str(token_file),
        None,
    )
    explicit = Login.resolve(
        host="http://localhost:8080/", token="flag-token", env={**env, "KF_PIPELINES_TOKEN": "x"}
    )
    assert (explicit.host, explicit.token, explicit.method) == (
        "http://localhost:8080",
        "flag-token",
        "--token",
    )
    from_env = Login.resolve(host="http://h", env={"KF_PIPELINES_TOKEN": "env-token"})
    assert (from_env.token, from_env.method) == ("env-token", "KF_PIPELINES_TOKEN")
    with pytest.raises(ValueError, match="no KFP host: pass --host"):
        Login.resolve(env={"KF_PIPELINES_SA_TOKEN_PATH": str(tmp_path / "absent")})


def test_login_never_shows_its_secrets():
    login = Login.resolve(host="http://h", token="s3cr3t-token", cookies="a=cookie-one; b=cookie-two", env={})
    assert "s3cr3t" not in repr(login) and "cookie-one" not in repr(login)
    assert login.redact("token s3cr3t-token, cookies cookie-one cookie-two") == "token ***, cookies *** ***"
