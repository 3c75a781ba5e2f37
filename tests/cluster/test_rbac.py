"""The RBAC in deploy/rbac and deploy/overlays/profile, applied for real and checked by the API server's
authorizer (SelfSubjectAccessReview under impersonation, i.e. `kubectl auth can-i --as`): the pipeline's runner
(`pipeline-runner` standalone, `default-editor` in a profile namespace) may create, get, list, watch, patch and
delete TrainJobs and list events in its own namespace and nothing else, nowhere else; the serving account,
whose pods never call the API, may do nothing."""

from __future__ import annotations

import pytest

from tests.cluster.helpers import (
    DEPLOY,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
)

GRANTED = [
    ("trainjobs.trainer.kubeflow.org", v) for v in ("create", "get", "list", "watch", "patch", "delete")
]
GRANTED += [("events", "list")]
DENIED = [
    ("trainjobs.trainer.kubeflow.org", "update"), ("trainjobs.trainer.kubeflow.org", "deletecollection"),
("jobsets.jobset.x-k8s.io", "create"),
    ("clustertrainingruntimes.trainer.kubeflow.org", "create"), ("pods", "create"), ("pods", "list"),
    ("secrets", "get"), ("events", "create"), ("roles.rbac.authorization.k8s.io", "create"),
    ("customresourcedefinitions.apiextensions.k8s.io", "get"),
]  # fmt: skip


def _can(cp, account: str, verb: str, resource: str, namespace: str | None) -> bool:
    ns, _, name = account.partition("/")
    where = ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = cp.kubectl("auth", "can-i", verb, resource, *where, f"--as=system:serviceaccount:{ns}:{name}",
                      "--as-group=system:serviceaccounts", f"--as-group=system:serviceaccounts:{ns}")  # fmt: skip
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def applied(control_plane, trainer_stack):
    """deploy/rbac and deploy/serving as shipped (namespace kubeflow) and the profile overlay (team-a), applied."""
    cp = control_plane
    for ns in ("kubeflow", "team-a"):
        cp.kubectl("create", "namespace", ns)
    cp.kubectl_ok("apply", "-k", str(DEPLOY / "rbac"))
    cp.kubectl_ok("apply", "-k", str(DEPLOY / "serving"))
    cp.kubectl_ok("apply", "-k", str(DEPLOY / "overlays" / "profile"))
    return cp


@pytest.mark.parametrize(("runner", "own", "other"), [
    ("kubeflow/pipeline-runner", "kubeflow", "team-a"),
    ("team-a/default-editor", "team-a", "kubeflow"),
])  # fmt: skip
def test_the_runner_may_do_what_the_launcher_does_in_its_namespace_only(applied, runner, own, other):
    cp = applied
    for resource, verb in GRANTED:
        assert _can(cp, runner, verb, resource, own), f"{runner} may not {verb} {resource} in {own}"
        assert not _can(cp, runner, verb, resource, other), f"{runner} may {verb} {resource} in {other}"
        assert not _can(cp, runner, verb, resource, None), f"{runner} may {verb} {resource} cluster-wide"
    for resource, verb in DENIED:
        assert not _can(cp, runner, verb, resource, own), f"{runner} may {verb} {resource} in {own}"


def test_the_profile_overlay_grants_nothing_to_the_kubeflow_namespaces_runners(applied):
    """The subjects name no namespace, so in team-a's binding they are team-a's accounts (appliesToUser)."""
    cp = applied
    assert not _can(cp, "kubeflow/default-editor", "create", "trainjobs.trainer.kubeflow.org", "team-a")
    assert not _can(cp, "kubeflow/pipeline-runner", "create", "trainjobs.trainer.kubeflow.org", "team-a")
    assert _can(cp, "team-a/pipeline-runner", "create", "trainjobs.trainer.kubeflow.org", "team-a")


@pytest.mark.parametrize("namespace", ["kubeflow", "team-a"])
def test_the_serving_account_may_call_nothing(applied, namespace):
    """KServe's controller reads the account's Secret; the predictor pod itself has no token and no rights."""
    cp = applied
    account = f"{namespace}/cifar10-kfp-serving"
    sa = cp.kubectl_ok("get", "serviceaccount", "cifar10-kfp-serving", "-n", namespace, "-o", "json").stdout
    assert '"automountServiceAccountToken": false' in sa and "cifar10-kfp-serving-s3" in sa
    for verb, resource in [("get", "secrets"), ("list", "secrets"), ("get", "pods"), ("create", "pods"),
                           ("get", "inferenceservices.serving.kserve.io"), ("list", "trainjobs.trainer.kubeflow.org")]:  # fmt: skip
        assert not _can(cp, account, verb, resource, namespace), f"the serving account may {verb} {resource}"
