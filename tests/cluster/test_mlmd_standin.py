"""The ML Metadata stand-in (localcluster/mlmd_server.py) answers ml_metadata's own gRPC client.

The client runs in the ml-metadata venv (mlmd_client_checks.py): types, a context, artifacts and an
execution with custom properties, events, attributions, read back through the server, and the
error class each failing call raises on the client, which is decided by the gRPC status code the
server answers. Needs no control plane; the first run builds the venv from PyPI.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from localcluster import mlmd, procs

CHECKS = pathlib.Path(__file__).resolve().parent / "mlmd_client_checks.py"


def run_checks(mode: str, address: str) -> dict:
    """mlmd_client_checks.py `mode` against address, in the ml-metadata venv; its JSON output."""
    argv = [str(mlmd.venv_python()), str(CHECKS), mode, address]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{mode} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlmd")
    with mlmd.MlmdServer("127.0.0.1", procs.free_port(), tmp / "mlmd.sqlite") as srv:
        yield srv


@pytest.fixture(scope="module")
def scenario(server):
    return run_checks("scenario", server.address)


def test_types_are_idempotent_and_distinct(scenario):
    ids = scenario["ids"]
    assert ids["model_again"] == ids["model"]
    assert len({ids["model"], ids["container"], ids["run"]}) == 3


def test_context_holds_the_execution_and_every_attributed_artifact(scenario):
    read = scenario["read"]
    assert read["context_artifact_uris"] == ["s3://b/data", "s3://b/extra", "s3://b/model"]
    assert read["context_execution_ids"] == [scenario["graph"]["exec"]]
    assert read["contexts_of_extra"] == ["run-1"]
    assert read["context_by_name"] == scenario["graph"]["ctx"]


def test_events_and_custom_properties_round_trip(scenario):
    data_id, model_id = scenario["graph"]["arts"]
    read = scenario["read"]
    assert read["events"] == sorted([[data_id, "INPUT"], [model_id, "OUTPUT"]])
    assert read["custom"] == {"s3://b/data": [0.0, 3], "s3://b/model": [0.93, 3]}
    assert read["execution"] == ["train", "COMPLETE"]


def test_errors_reach_the_client_with_their_canonical_code(scenario):
    assert scenario["errors"] == {
        "unknown_type_id": "NotFoundError",
        "type_changed": "AlreadyExistsError",
        "duplicate_context": "AlreadyExistsError",
        "missing_type": "NotFoundError",
        "bad_property": "InvalidArgumentError",
        "unwrapped_method": "UnimplementedError",
    }


def test_server_log_names_the_failed_calls(server, scenario):
    log = server.process.log_path.read_text()
    assert "serving 49 of 52 methods of ml_metadata.MetadataStoreService" in log
    assert "PutArtifacts failed: Cannot find type for type_id: 987654" in log


def test_database_survives_a_restart(tmp_path):
    db = tmp_path / "mlmd.sqlite"
    with mlmd.MlmdServer("127.0.0.1", procs.free_port(), db) as first:
        seeded = run_checks("seed", first.address)
    assert first.process.popen.returncode == 0, "SIGTERM must stop the server cleanly"
    assert "mlmd_server: stopped" in first.process.log_path.read_text()
    # The same port and log: readiness must come from the new run's log lines, not the old ones.
    with mlmd.MlmdServer("127.0.0.1", first.port, db) as second:
        assert run_checks("read", second.address) == {
            "ctx": seeded["ctx"],
            "note": "written before the restart",
        }


def test_busy_port_fails_instead_of_sharing_it(server, tmp_path):
    # Without grpc.so_reuseport=0 a second server would bind the same port and the readiness
    # probe would be answered by the first one.
    with pytest.raises(RuntimeError, match=r"mlmd exited with status"):
        mlmd.MlmdServer("127.0.0.1", server.port, tmp_path / "other.sqlite").start()


def test_unopenable_database_fails_with_the_server_log(tmp_path):
    db = tmp_path / "no-such-dir" / "mlmd.sqlite"
    with pytest.raises(RuntimeError, match=r"(?s)mlmd exited with status.*mlmd\.log"):
        mlmd.MlmdServer("127.0.0.1", procs.free_port(), db, log_dir=tmp_path).start()
