"""cifar10_kfp.publish.kubeflow_registry against the real registry server: register, re-register, resolve, outage, token."""

from __future__ import annotations

import pytest

from cifar10_kfp.publish import kubeflow_registry as kr

VERSION_URI = "s3://mlpipeline/cifar10-kfp/models/{name}/20260101T000000Z-abc"


def _artifact(name: str) -> str:
    return kr.artifact_uri(
        VERSION_URI.format(name=name), endpoint="127.0.0.1:9000", secure=False, region="us-east-1"
    )


def test_artifact_uri_is_the_triton_folder_as_s3_uri_from_writes_it():
    uri = _artifact("m")
    assert uri == (
        "s3://mlpipeline/cifar10-kfp/models/m/20260101T000000Z-abc/triton"
        "?endpoint=http://127.0.0.1:9000&defaultRegion=us-east-1"
    )
    assert kr.version_uri_of_artifact(uri) == VERSION_URI.format(name="m")


def test_register_then_reregister_is_idempotent(registry_server):
    props = {"test_accuracy": 0.91, "run_id": "abc", "gate_passed": True}
    first = kr.register_version(registry_server.url, model_name="idem", version="v1", artifact=_artifact("idem"),
                                properties=props)  # fmt: skip
    again = kr.register_version(registry_server.url, model_name="idem", version="v1", artifact=_artifact("idem"),
                                properties=props)  # fmt: skip
    assert not first.already_registered and again.already_registered
    assert again.model_version_id == first.model_version_id and again.artifact_id == first.artifact_id
    with kr.connect(registry_server.url) as client:
        versions = list(client.get_model_versions("idem"))
        assert [v.name for v in versions] == ["v1"]
        assert versions[0].custom_properties == props
        artifact = client.get_model_artifact("idem", "v1")
    assert (artifact.model_format_name, artifact.model_format_version) == ("pytorch", "1")


def test_a_registered_version_is_never_changed(registry_server):
    kr.register_version(registry_server.url, model_name="fixed", version="v1", artifact=_artifact("fixed"),
                        properties={})  # fmt: skip
    with pytest.raises(kr.ModelRegistryError, match="already registered with artifact"):
        kr.register_version(registry_server.url, model_name="fixed", version="v1", artifact=_artifact("other"),
                            properties={})  # fmt: skip


def test_a_version_left_without_its_artifact_gets_it_on_reregistration(registry_server):
    with kr.connect(registry_server.url) as client:  # what an interrupted registration leaves: no artifact
        rm = client.async_runner(client._register_model("torn", owner="tests"))
        client.async_runner(client._register_new_version(rm, "v1", "tests"))
        assert client.get_model_artifact("torn", "v1") is None
    with pytest.raises(FileNotFoundError, match="has no model artifact"):
        kr.resolve_registry_uri("model-registry://torn/v1", url=registry_server.url)
    done = kr.register_version(registry_server.url, model_name="torn", version="v1", artifact=_artifact("torn"),
                               properties={})  # fmt: skip
    assert done.already_registered
    assert kr.resolve_registry_uri("model-registry://torn/v1", url=registry_server.url) == VERSION_URI.format(
        name="torn"
    )


def test_resolve_without_version_takes_the_newest(registry_server):
    for version in ("v1", "v2"):
        kr.register_version(registry_server.url, model_name="newest", version=version,
                            artifact=_artifact("newest").replace("-abc", f"-{version}"), properties={})  # fmt: skip
    assert kr.resolve_registry_uri("model-registry://newest", url=registry_server.url).endswith("-v2")
    assert kr.resolve_registry_uri("model-registry://newest/v1", url=registry_server.url).endswith("-v1")
    with pytest.raises(FileNotFoundError, match="no model named 'absent'"):
        kr.resolve_registry_uri("model-registry://absent", url=registry_server.url)


def test_registry_down_fails_clearly_then_back_registers(own_registry_server):
    server = own_registry_server
    server.stop_server()
    with pytest.raises(kr.ModelRegistryError, match=f"model registry at {server.url} is unreachable"):
        kr.register_version(server.url, model_name="outage", version="v1", artifact=_artifact("outage"),
                            properties={})  # fmt: skip
    server.start_server()
    done = kr.register_version(server.url, model_name="outage", version="v1", artifact=_artifact("outage"),
                               properties={})  # fmt: skip
    assert not done.already_registered


def test_the_token_is_never_in_an_error(own_registry_server, monkeypatch):
    token = "tok-" + "9f3c2a77e1b04d0e"
    monkeypatch.setenv(kr.TOKEN_ENV, token)
    assert kr.resolve_token() == token
    own_registry_server.stop_server()
    with pytest.raises(kr.ModelRegistryError) as caught:
        kr.register_version(own_registry_server.url, model_name="tok", version="v1", artifact=_artifact("tok"),
                            properties={})  # fmt: skip
    assert token not in str(caught.value) and token not in repr(caught.value.__cause__)


def test_every_call_carries_the_bearer_token(guarded_registry, registry_server, monkeypatch):
    # found where a pod finds it (resolve_token), not passed as an argument
    monkeypatch.setenv(kr.TOKEN_ENV, guarded_registry.token)
    kr.register_version(guarded_registry.url, model_name="guarded", version="v1", artifact=_artifact("guarded"),
                        properties={"run_id": "g"})  # fmt: skip
    resolved = kr.resolve_registry_uri("model-registry://guarded", url=guarded_registry.url)
    assert resolved == VERSION_URI.format(name="guarded")
    seen = guarded_registry.requests
    writes = {(r.method, r.path.split("?")[0].rsplit("/", 1)[-1]) for r in seen if r.method != "GET"}
    assert {("POST", "registered_models"), ("POST", "model_versions"), ("POST", "artifacts")} <= writes, (
        writes
    )
    assert [
        r for r in seen if r.authorization != f"Bearer {guarded_registry.token}" or r.status in (401, 502)
    ] == []
    with kr.connect(registry_server.url, token="") as direct:  # it reached the real server
        assert direct.get_model_artifact("guarded", "v1").uri == _artifact("guarded")


@pytest.mark.parametrize("sent", ["no token", "another token"])
def test_without_the_token_the_guarded_registry_refuses_clearly(
    guarded_registry, monkeypatch, tmp_path, sent
):
    empty = tmp_path / "token"
    empty.write_text("")  # KF_PIPELINES_SA_TOKEN_PATH naming an empty file: no token at all
    monkeypatch.setenv(kr.TOKEN_PATH_ENV, str(empty))
    wrong = "tok-" + "0000aaaa1111bbbb"
    if sent == "another token":
        monkeypatch.setenv(kr.TOKEN_ENV, wrong)
    else:
        monkeypatch.delenv(kr.TOKEN_ENV, raising=False)
    with pytest.raises(
        kr.ModelRegistryError, match=f"model registry at {guarded_registry.url} .*refused.*401"
    ) as caught:
        kr.register_version(guarded_registry.url, model_name="refused", version="v1",
                            artifact=_artifact("refused"), properties={})  # fmt: skip
    assert wrong not in str(caught.value)
    expected = None if sent == "no token" else f"Bearer {wrong}"
    assert [(r.authorization, r.status) for r in guarded_registry.requests] == [(expected, 401)]
