"""The pinned pair: the registry server v0.3.0 and the Python client model-registry 0.3.0 speak one API."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import pytest
from model_registry import ModelRegistry

from localcluster.model_registry import API_PREFIX, ModelRegistryServer


def _client(server: ModelRegistryServer) -> ModelRegistry:
    return ModelRegistry("http://127.0.0.1", server.port, author="tests", is_secure=False)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback test server
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_server_serves_the_api_the_pinned_client_calls(registry_server):
    assert _status(f"{registry_server.url}{API_PREFIX}/registered_models") == 200
    # Newer clients (0.3.12+) call /api/model_registry/v1: this server does not have it.
    assert _status(f"{registry_server.url}/api/model_registry/v1/registered_models") == 404
    from mr_openapi.api import model_registry_service_api

    source = open(model_registry_service_api.__file__).read()
    assert f'"{API_PREFIX}/registered_models"' in source


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_register_and_read_back_properties(registry_server):
    client = _client(registry_server)
    client.register_model(
        "pair-model",
        "s3://bucket/models/pair-model/v1/?endpoint=http://127.0.0.1:9000",
        version="v1",
        model_format_name="pytorch",
        model_format_version="2",
        metadata={"test_accuracy": 0.5, "run_id": "r1"},
    )
    version = client.get_model_version("pair-model", "v1")
    assert version.custom_properties == {"test_accuracy": 0.5, "run_id": "r1"}
    artifact = client.get_model_artifact("pair-model", "v1")
    assert artifact.uri == "s3://bucket/models/pair-model/v1/?endpoint=http://127.0.0.1:9000"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_down_then_back_keeps_what_was_registered(own_registry_server):
    server = own_registry_server
    _client(server).register_model("outage-model", "s3://b/k", version="v1", model_format_name="pytorch",
                                   model_format_version="2")  # fmt: skip
    server.stop_server()
    with pytest.raises(Exception, match="(?i)connect"):
        _client(server)  # the constructor lists models: a down server refuses the connection
    server.start_server()
    assert _client(server).get_model_artifact("outage-model", "v1").uri == "s3://b/k"


def test_close_leaves_no_process_and_no_files():
    server = ModelRegistryServer().start()
    pids = [server._server.pid, server._db.pid]
    work_dir = server.work_dir
    server.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not work_dir.exists()
