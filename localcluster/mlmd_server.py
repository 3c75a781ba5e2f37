"""ML Metadata's gRPC MetadataStoreService, served by the C++ MetadataStore of the ml-metadata wheel.

Stands in for upstream's `ml_metadata_store_server` (google/ml-metadata:
ml_metadata/metadata_store/metadata_store_server_main.cc and metadata_store_service_impl.cc), which
Kubeflow Pipelines 2.17.0 deploys from gcr.io/tfx-oss-public/ml_metadata_store_server:1.14.0 as
`metadata-grpc-deployment` behind `metadata-grpc-service:8080`
(kubeflow/pipelines manifests/kustomize/base/metadata/base/metadata-grpc-deployment.yaml). KFP's
Go driver and launcher (backend/src/v2/metadata/client.go) call it over plain gRPC.

The C++ server cannot be built here (Bazel), but the `ml-metadata` wheel's pybind extension holds
the same C++ MetadataStore: its Python `MetadataStore._call(method, request, response)` runs any
service method on it. This script serves every method of `ml_metadata.MetadataStoreService`,
enumerated from the service descriptor, through that call, on an SQLite database. As upstream's
MetadataStoreServiceImpl does, one store serves all requests under one lock, and an error's
canonical code (absl and gRPC codes are the same numbers) becomes the call's gRPC status code.

Runs inside the ml-metadata virtualenv (localcluster/mlmd.py builds it), so it imports
only ml_metadata, grpc and the standard library:

    python mlmd_server.py serve --host 127.0.0.1 --port 8080 --db /path/mlmd.sqlite
    python mlmd_server.py probe --address 127.0.0.1:8080 --timeout 5
"""

from __future__ import annotations

import argparse
import concurrent.futures
import signal
import sys
import threading

import grpc
from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2, metadata_store_service_pb2

SERVICE = metadata_store_service_pb2.DESCRIPTOR.services_by_name["MetadataStoreService"]
# The limits upstream's KFP manifest passes in --grpc_channel_arguments (100 MiB messages).
_MAX_MESSAGE_BYTES = 104857600
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", 16384),
    # gRPC sets SO_REUSEPORT by default: a second server would share a busy port instead of failing.
    ("grpc.so_reuseport", 0),
]
_STATUS_BY_CODE = {code.value[0]: code for code in grpc.StatusCode}
# Service methods the wheel's pybind module does not wrap (1.17.1: GetLineageGraph and the plural
# parent/child context lookups); they answer UNIMPLEMENTED. KFP 2.17.0's Go client uses none of them.
UNWRAPPED = frozenset(
    m.name for m in SERVICE.methods if not hasattr(metadata_store.metadata_store_serialized, m.name)
)


def open_store(db_path: str) -> metadata_store.MetadataStore:
    """The C++ MetadataStore on an SQLite file, created (with its schema) when missing."""
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = db_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    # Upgrading an older schema in place, as the KFP manifest's --enable_database_upgrade=true does.
    return metadata_store.MetadataStore(config, enable_upgrade_migration=True)


def grpc_status(exc: errors.StatusError) -> grpc.StatusCode:
    """The gRPC status code of an ml_metadata error (UNKNOWN for a code gRPC does not define)."""
    return _STATUS_BY_CODE.get(exc.error_code, grpc.StatusCode.UNKNOWN)


class MetadataStoreService(grpc.GenericRpcHandler):
    """Every unary method of ml_metadata.MetadataStoreService, run on one store under one lock."""

    def __init__(self, store: metadata_store.MetadataStore):
        self._store = store
        # The C++ store holds one database connection, which is not safe to share between threads.
        self._lock = threading.Lock()
        self._handlers = {f"/{SERVICE.full_name}/{m.name}": self._handler(m) for m in SERVICE.methods}

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)

    def _handler(self, method) -> grpc.RpcMethodHandler:
        request_cls = metadata_store_service_pb2.__dict__[method.input_type.name]
        response_cls = metadata_store_service_pb2.__dict__[method.output_type.name]
        if method.name in UNWRAPPED:
            return _unimplemented(method.name, request_cls, response_cls)

        def call(request, context):
            response = response_cls()
            try:
                with self._lock:
                    self._store._call(method.name, request, response)
            except errors.StatusError as exc:
                print(f"{method.name} failed: {exc}", file=sys.stderr, flush=True)
                context.abort(grpc_status(exc), str(exc))
            return response

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=request_cls.FromString,
            response_serializer=response_cls.SerializeToString,
        )


def _unimplemented(name: str, request_cls, response_cls) -> grpc.RpcMethodHandler:
    def call(request, context):
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"{name} is not wrapped by the ml-metadata wheel's MetadataStore"
        )

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=request_cls.FromString, response_serializer=response_cls.SerializeToString
    )


def serve(host: str, port: int, db_path: str) -> None:
    """Serve until SIGTERM or SIGINT, then finish the calls in flight and exit."""
    store = open_store(db_path)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=_CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((MetadataStoreService(store),))
    address = f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"mlmd_server: cannot listen on {address}")
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    server.start()
    served = len(SERVICE.methods) - len(UNWRAPPED)
    print(
        f"mlmd_server: serving {served} of {len(SERVICE.methods)} methods of {SERVICE.full_name} on "
        f"{address} (sqlite {db_path}); unimplemented: {', '.join(sorted(UNWRAPPED)) or 'none'}",
        flush=True,
    )
    stopping.wait()
    server.stop(grace=5).wait()
    print("mlmd_server: stopped", flush=True)


def probe(address: str, timeout_s: float) -> None:
    """One real call (GetArtifactTypes) through ml_metadata's own gRPC client; raises on failure."""
    host, _, port = address.rpartition(":")
    config = metadata_store_pb2.MetadataStoreClientConfig(host=host, port=int(port))
    config.client_timeout_sec = timeout_s
    metadata_store.MetadataStore(config).get_artifact_types()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("--host", required=True)
    serve_p.add_argument("--port", type=int, required=True)
    serve_p.add_argument("--db", required=True)
    probe_p = sub.add_parser("probe")
    probe_p.add_argument("--address", required=True)
    probe_p.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.host, args.port, args.db)
    else:
        probe(args.address, args.timeout)


if __name__ == "__main__":
    main()
