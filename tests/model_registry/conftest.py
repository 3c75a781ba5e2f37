"""A real Kubeflow Model Registry server (built from its Go module) on a real MariaDB, for this folder.

`make test-registry` runs these tests; `make test` leaves them out (they need Debian's mariadb-server,
which .ci/run installs). A missing MariaDB or Go is an error that says what to install, never a skip.
"""

from __future__ import annotations

import pytest

from localcluster.model_registry import ModelRegistryServer
from tests.support.bearer_proxy import BearerTokenProxy


@pytest.fixture(scope="session")
def registry_server():
    """One registry + database for the session; tests use distinct model names."""
    with ModelRegistryServer() as server:
        yield server


@pytest.fixture
def own_registry_server():
    """A registry of this test's own, for tests that take it down."""
    with ModelRegistryServer() as server:
        yield server


@pytest.fixture
def guarded_registry(registry_server):
    """The session's registry behind a proxy that answers 401 to a request without ``Bearer <proxy.token>``,
    as kube-rbac-proxy or Istio guards it in Kubeflow; ``proxy.requests`` is what it was sent."""
    with BearerTokenProxy(registry_server.url, token="tok-" + "5d8e1f0a9b2c4e67") as proxy:
        yield proxy
