"""Every manifest in deploy/ passes a server-side dry run on the real API server (schema, defaulting,
admission: the Trainer's webhook for the runtime, PodSecurity for the pods), each kustomize base as rendered
by kubectl's own kustomize, into namespaces labelled to enforce (and warn about) the restricted standard."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cluster.helpers import (
    DEPLOY,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
)

BASES = ("rbac", "serving", "train-job", "trainer-runtime", "overlays/profile", "overlays/profile-train-job")
PLACEHOLDERS = ("object-store-secret.example.yaml", "serving/s3-secret.example.yaml")
RESTRICTED = ("pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/warn=restricted")


_SHARED_NAMESPACES = ("kubeflow", "team-a")  # later modules run pods there: their labels are put back
_RESTRICTED_KEYS = [kv.split("=")[0] for kv in RESTRICTED]


def _labels(cp, name: str) -> dict | None:
    got = cp.kubectl("get", "namespace", name, "-o", "json")
    return json.loads(got.stdout)["metadata"].get("labels", {}) if got.returncode == 0 else None


@pytest.fixture(autouse=True)
def _shared_namespaces_put_back(control_plane):
    """Enforcing `restricted` on the shared `kubeflow` namespace refused every later KFP component pod
    (issue 24: "violates PodSecurity ... runAsNonRoot != true"), so each test leaves its labels as found."""
    before = {name: _labels(control_plane, name) for name in _SHARED_NAMESPACES}
    yield
    for name, labels in before.items():
        if _labels(control_plane, name) is None:
            continue
        labels = labels or {}  # a namespace the test created keeps no label it added
        args = [f"{k}={labels[k]}" if k in labels else f"{k}-" for k in _RESTRICTED_KEYS]
        control_plane.kubectl_ok("label", "namespace", name, "--overwrite", *args)


def _restricted_namespace(cp, name: str) -> None:
    cp.kubectl("create", "namespace", name)
    cp.kubectl_ok("label", "namespace", name, "--overwrite", *RESTRICTED)


def _server_dry_run(cp, docs: list[dict]):
    # apply (not create): the same server-side checks, and objects an earlier test applied are no conflict
    return cp.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-",
                      input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))  # fmt: skip


def _json_documents(text: str) -> list[dict]:
    """kubectl prints one JSON document per object it created; a List's items when it prints a List."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        doc, at = decoder.raw_decode(text, at)
        docs.extend(doc.get("items", [doc]) if doc.get("kind", "").endswith("List") else [doc])
        while at < len(text) and text[at].isspace():
            at += 1
    return docs


@pytest.mark.parametrize("base", BASES)
def test_each_kustomize_base_passes_a_server_side_dry_run(control_plane, trainer_stack, base):
    cp = control_plane
    docs = [d for d in yaml.safe_load_all(cp.kubectl_ok("kustomize", str(DEPLOY / base)).stdout) if d]
    assert docs, f"deploy/{base} renders nothing"
    for ns in {d["metadata"].get("namespace") for d in docs} - {None}:
        _restricted_namespace(cp, ns)
    result = _server_dry_run(cp, docs)
    assert result.returncode == 0, f"deploy/{base}: {result.stderr}"
    assert "would violate PodSecurity" not in result.stderr, f"deploy/{base}: {result.stderr}"
    items = _json_documents(result.stdout)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in items) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )
    for obj in items:  # defaulted by the server: a Job's pods get the restricted fields and their defaults
        if obj["kind"] == "Job":
            assert obj["spec"]["template"]["spec"]["restartPolicy"] == "Never"
            assert obj["spec"]["completionMode"] == "NonIndexed"


def test_the_example_secrets_pass_a_server_side_dry_run(control_plane):
    cp = control_plane
    _restricted_namespace(cp, "kubeflow")
    for rel in PLACEHOLDERS:
        docs = [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]
        for doc in docs:
            doc["metadata"].setdefault("namespace", "kubeflow")
        result = _server_dry_run(cp, docs)
        assert result.returncode == 0, f"{rel}: {result.stderr}"


def test_a_job_that_breaks_the_restricted_standard_is_warned_about(control_plane):
    """The check above can fail: the same dry run of deploy/train-job, its Job's pod running as root,
    gets the warning that check looks for. PodSecurity only warns about a workload (a Job); it refuses
    the Job's pods when they are created (staging/src/k8s.io/pod-security-admission/admission/admission.go,
    ValidatePodController: warnings only)."""
    cp = control_plane
    docs = [d for d in yaml.safe_load_all(cp.kubectl_ok("kustomize", str(DEPLOY / "train-job")).stdout) if d]
    for ns in {d["metadata"].get("namespace") for d in docs} - {None}:
        _restricted_namespace(cp, ns)
    [job] = [d for d in docs if d["kind"] == "Job"]
    job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    result = _server_dry_run(cp, docs)
    assert result.returncode == 0, result.stderr  # admitted, as a real apply would be
    assert "would violate PodSecurity" in result.stderr and "runAsNonRoot" in result.stderr, result.stderr
