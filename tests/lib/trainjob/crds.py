"""Plain data for the pure unit tests of cifar10_kfp.trainjob (no server): TrainJob CRD schemas of the
Trainer releases and status conditions. What a real API server says is tested in tests/cluster/."""

from __future__ import annotations

# spec.properties of the TrainJob CRD's v1alpha1 schema, per release: kubeflow/trainer
# manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml at tags v2.0.0, v2.1.0 and v2.2.0.
TRAINJOB_SPEC_FIELDS = {
    "2.0": ("annotations", "initializer", "labels", "managedBy", "podSpecOverrides", "runtimeRef", "suspend",
            "trainer"),
    "2.1": ("annotations", "initializer", "labels", "managedBy", "podTemplateOverrides", "runtimeRef", "suspend",
            "trainer"),
    "2.2": ("activeDeadlineSeconds", "initializer", "managedBy", "runtimePatches", "runtimeRef", "suspend",
            "trainer"),
}  # fmt: skip


def trainjob_crd(version: str) -> dict:
    """The parts of the TrainJob CustomResourceDefinition a client reads: its served schema's spec fields."""
    spec_fields = {name: {"type": "object"} for name in TRAINJOB_SPEC_FIELDS[version]}
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": spec_fields}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
        "spec": {"group": "trainer.kubeflow.org", "names": {"kind": "TrainJob", "plural": "trainjobs"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema}}]},
    }  # fmt: skip


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
