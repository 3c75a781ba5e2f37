"""Calls to the ML Metadata stand-in through ml_metadata's own gRPC client; prints what came back as JSON.

Runs in the ml-metadata venv (localcluster/mlmd.py), not in the project's, so it imports
only ml_metadata and the standard library. test_mlmd_standin.py runs it and asserts on its output:

    python mlmd_client_checks.py scenario HOST:PORT   # types, context, artifacts, executions, events, errors
    python mlmd_client_checks.py seed HOST:PORT       # one context, for the restart check
    python mlmd_client_checks.py read HOST:PORT       # that context's name and custom property
"""

from __future__ import annotations

import json
import sys

from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as pb
from ml_metadata.proto import metadata_store_service_pb2 as svc

RUN_TYPE, RUN_NAME = "system.PipelineRun", "run-restart"


def connect(address: str) -> metadata_store.MetadataStore:
    host, _, port = address.rpartition(":")
    config = pb.MetadataStoreClientConfig(host=host, port=int(port))
    config.client_timeout_sec = 10
    return metadata_store.MetadataStore(config)


def error_of(call) -> str:
    """The ml_metadata error class a call raises (its name), or 'no error'."""
    try:
        call()
    except errors.StatusError as exc:
        return type(exc).__name__
    return "no error"


def put_types(store) -> dict:
    model = pb.ArtifactType(name="system.Model", properties={"framework": pb.STRING})
    container = pb.ExecutionType(name="system.ContainerExecution", properties={"image": pb.STRING})
    run = pb.ContextType(name="system.PipelineRun")
    ids = {
        "model": store.put_artifact_type(model),
        "container": store.put_execution_type(container),
        "run": store.put_context_type(run),
    }
    ids["model_again"] = store.put_artifact_type(model)
    return ids


def put_graph(store, ids: dict) -> dict:
    ctx = pb.Context(type_id=ids["run"], name="run-1")
    ctx.custom_properties["namespace"].string_value = "team-a"
    [ctx_id] = store.put_contexts([ctx])
    ctx.id = ctx_id  # put_execution then links to it instead of inserting it again
    arts = []
    for uri, acc in (("s3://b/data", 0.0), ("s3://b/model", 0.93)):
        art = pb.Artifact(type_id=ids["model"], uri=uri, state=pb.Artifact.LIVE)
        art.properties["framework"].string_value = "torch"
        art.custom_properties["accuracy"].double_value = acc
        art.custom_properties["epochs"].int_value = 3
        arts.append(art)
    execution = pb.Execution(type_id=ids["container"], last_known_state=pb.Execution.COMPLETE)
    execution.properties["image"].string_value = "trainer:1"
    execution.custom_properties["task"].string_value = "train"
    pairs = [(arts[0], pb.Event(type=pb.Event.INPUT)), (arts[1], pb.Event(type=pb.Event.OUTPUT))]
    exec_id, art_ids, _ = store.put_execution(execution, pairs, [ctx])
    # An artifact attributed to the context explicitly, not through an execution.
    extra = pb.Artifact(type_id=ids["model"], uri="s3://b/extra")
    [extra_id] = store.put_artifacts([extra])
    store.put_attributions_and_associations([pb.Attribution(artifact_id=extra_id, context_id=ctx_id)], [])
    return {"ctx": ctx_id, "exec": exec_id, "arts": art_ids, "extra": extra_id}


def read_back(store, ids: dict, graph: dict) -> dict:
    [execution] = store.get_executions_by_id([graph["exec"]])
    return {
        "context_artifact_uris": sorted(a.uri for a in store.get_artifacts_by_context(graph["ctx"])),
        "context_execution_ids": [e.id for e in store.get_executions_by_context(graph["ctx"])],
        "events": sorted(
            [e.artifact_id, pb.Event.Type.Name(e.type)]
            for e in store.get_events_by_execution_ids([graph["exec"]])
        ),
        "custom": {
            a.uri: [a.custom_properties["accuracy"].double_value, a.custom_properties["epochs"].int_value]
            for a in store.get_artifacts_by_id(graph["arts"])
        },
        "execution": [
            execution.custom_properties["task"].string_value,
            pb.Execution.State.Name(execution.last_known_state),
        ],
        "contexts_of_extra": [c.name for c in store.get_contexts_by_artifact(graph["extra"])],
        "context_by_name": store.get_context_by_type_and_name("system.PipelineRun", "run-1").id,
    }


def errors_seen(store, ids: dict) -> dict:
    return {
        "unknown_type_id": error_of(lambda: store.put_artifacts([pb.Artifact(type_id=987654, uri="s3://x")])),
        "type_changed": error_of(
            lambda: store.put_artifact_type(
                pb.ArtifactType(name="system.Model", properties={"framework": pb.INT})
            )
        ),
        "duplicate_context": error_of(
            lambda: store.put_contexts([pb.Context(type_id=ids["run"], name="run-1")])
        ),
        "missing_type": error_of(lambda: store.get_artifact_type("no.SuchType")),
        "bad_property": error_of(
            lambda: store.put_executions([_execution_with_unknown_property(ids["container"])])
        ),
        # The wheel's client has no method for it; its generic gRPC call reaches the server all the same.
        "unwrapped_method": error_of(
            lambda: store._call(
                "GetLineageGraph", svc.GetLineageGraphRequest(), svc.GetLineageGraphResponse()
            )
        ),
    }


def _execution_with_unknown_property(type_id: int) -> pb.Execution:
    execution = pb.Execution(type_id=type_id)
    execution.properties["not_in_type"].string_value = "x"
    return execution


def scenario(store) -> dict:
    ids = put_types(store)
    graph = put_graph(store, ids)
    return {
        "ids": ids,
        "graph": graph,
        "read": read_back(store, ids, graph),
        "errors": errors_seen(store, ids),
    }


def seed(store) -> dict:
    ctx = pb.Context(type_id=store.put_context_type(pb.ContextType(name=RUN_TYPE)), name=RUN_NAME)
    ctx.custom_properties["note"].string_value = "written before the restart"
    return {"ctx": store.put_contexts([ctx])[0]}


def read(store) -> dict:
    ctx = store.get_context_by_type_and_name(RUN_TYPE, RUN_NAME)
    return {"ctx": ctx.id, "note": ctx.custom_properties["note"].string_value}


if __name__ == "__main__":
    mode, address = sys.argv[1], sys.argv[2]
    print(json.dumps({"scenario": scenario, "seed": seed, "read": read}[mode](connect(address))))
