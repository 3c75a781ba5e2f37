"""Kubeflow profiles on the real control plane, made as Kubeflow's profile controller makes them.

A profile is a namespace owned by one user, in which the multi-user KFP API server (kfp.py,
`KfpBackend(multi_user=True)`) authorizes each request with a SubjectAccessReview of the caller:

- the namespace, annotated `owner: <user>` and labelled with the controller's default namespace
  labels (kubeflow/dashboard components/profile-controller/controllers/profile_controller.go,
  `Reconcile`; the labels from config/overlays/kubeflow/namespace-labels.yaml), which include
  `pipelines.kubeflow.org/enabled: "true"`, the label KFP's profile sync hook looks for. Here it also
  enforces the Pod Security Standard a security team sets on a profile (`restricted` by default);
- the ServiceAccounts `default-editor` and `default-viewer`, bound to the ClusterRoles `kubeflow-edit`
  and `kubeflow-view` (`updateServiceAccount`), and the owner's RoleBinding `namespaceAdmin` to
  `kubeflow-admin`;
- those three ClusterRoles aggregate everything labelled for them (kubeflow/manifests
  common/kubeflow-roles/base/cluster-roles.yaml; only the aggregating roles are made here), KFP's
  own pipeline rights among them: manifests/kustomize/base/installs/multi-user/view-edit-cluster-roles.yaml,
  applied from the pinned KFP tree by KfpBackend.

Not made: the Istio AuthorizationPolicy (no service mesh runs here) and the resource quota (a
profile without one gets none). The profile controller itself is not run: the objects it would
make are applied directly, and the Profile custom resource is not installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: The profile controller's default namespace labels (config/overlays/kubeflow/namespace-labels.yaml).
NAMESPACE_LABELS = {
    "katib.kubeflow.org/metrics-collector-injection": "enabled",
    "serving.kubeflow.org/inferenceservice": "enabled",
    "pipelines.kubeflow.org/enabled": "true",
    "app.kubernetes.io/part-of": "kubeflow-profile",
}

#: Audience of the tokens the KFP API server's TokenReview accepts (backend/src/apiserver/common:
#: GetTokenReviewAudience, default "pipelines.kubeflow.org"), as Kubeflow notebooks' projected token has.
KFP_AUDIENCE = "pipelines.kubeflow.org"

_AGGREGATE = "rbac.authorization.kubeflow.org/aggregate-to-kubeflow-{}"


def kubeflow_roles() -> list[dict]:
    """The aggregating ClusterRoles kubeflow-admin, -edit and -view (common/kubeflow-roles), with their
    labels: edit aggregates into admin and view into edit, as upstream's do."""
    roles = []
    for role, into in (("admin", None), ("edit", "admin"), ("view", "edit")):
        metadata: dict = {"name": f"kubeflow-{role}"}
        if into:
            metadata["labels"] = {_AGGREGATE.format(into): "true"}
        roles.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": metadata,
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {_AGGREGATE.format(role): "true"}}]},
            "rules": [],
        })  # fmt: skip
    return roles


@dataclass(frozen=True)
class Profile:
    """A profile: its namespace's name and its owner, the user the gateway's `kubeflow-userid` names."""

    name: str
    owner: str

    def objects(self, pod_security: str = "restricted") -> list[dict]:
        """What the profile controller makes for it, in the order it makes them."""
        namespace = {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {
                "name": self.name, "annotations": {"owner": self.owner},
                "labels": {**NAMESPACE_LABELS, "pod-security.kubernetes.io/enforce": pod_security},
            },
        }  # fmt: skip
        objects = [namespace]
        for account, role in (("default-editor", "kubeflow-edit"), ("default-viewer", "kubeflow-view")):
            objects.append(self._namespaced("ServiceAccount", account))
            subject = {"kind": "ServiceAccount", "name": account, "namespace": self.name}
            objects.append(self._binding(account, role, subject, {}))
        owner = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": self.owner}
        objects.append(
            self._binding("namespaceAdmin", "kubeflow-admin", owner, {"user": self.owner, "role": "admin"})
        )
        return objects

    def _namespaced(self, kind: str, name: str) -> dict:
        return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": self.name}}

    def _binding(self, name: str, role: str, subject: dict, annotations: dict) -> dict:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": self.name, "annotations": annotations},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject],
        }  # fmt: skip
        return binding

    def create(self, cp, pod_security: str = "restricted") -> None:
        """Apply the profile's objects on the control plane `cp` (the ClusterRoles first)."""
        items = [*kubeflow_roles(), *self.objects(pod_security)]
        cp.kubectl_ok(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

    def token(self, cp, account: str = "default-editor", audience: str = KFP_AUDIENCE) -> str:
        """A real token of one of the profile's ServiceAccounts, minted by the kube-apiserver (TokenRequest)."""
        return cp.kubectl_ok(
            "create", "token", account, "-n", self.name, f"--audience={audience}", "--duration=2h"
        ).stdout.strip()


#: The two teams of `make cluster-full MULTI_USER=1` and tests/cluster/test_multi_user.py.
TEAMS = (Profile("team-a", "alice@example.com"), Profile("team-b", "bob@example.com"))


__all__ = ["KFP_AUDIENCE", "NAMESPACE_LABELS", "TEAMS", "Profile", "kubeflow_roles"]
