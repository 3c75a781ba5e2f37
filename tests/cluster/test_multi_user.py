"""Multi-user KFP (issue 36): the real 2.17.0 API server authorizes every request against a profile.

The API server runs in multi-user mode (localcluster/kfp.py, `multi_user=True`, its settings read
from the pinned tree's multi-user manifests); two profiles, team-a (owner alice) and team-b (owner
bob), are made as Kubeflow's profile controller makes them (localcluster/profiles.py). Nothing on
the authorization path is a stand-in: each bearer token is a real ServiceAccount token minted by
the kube-apiserver, the API server sends it to that kube-apiserver's TokenReview, and its rights come
from a SubjectAccessReview there against the profile's RoleBindings and the aggregated ClusterRoles
(KFP's multi-user/view-edit-cluster-roles.yaml). tests/support/kfp_fake_server.py played these
answers before; what it still serves is said in its own docstring.

Runs in the profiles (pods in team-a under `restricted`, per-namespace store identity) are not here
yet: the workflow's pods need the profile sync hook's objects and a real node in the profile.
"""

from __future__ import annotations

import json
import pathlib
import urllib.error
import urllib.request

import pytest

from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from localcluster import kfp as kfp_harness
from localcluster.profiles import TEAMS
from tests.support.cli import command, user_env
from tests.support.paths import ROOT

TEAM_A, TEAM_B = TEAMS


@pytest.fixture(scope="module")
def multi_user_kfp(control_plane, tmp_path_factory):
    from tests.cluster import conftest  # the closing table's timings

    store_dir = tmp_path_factory.mktemp("kfp-mu-s3")
    with EmbeddedObjectStore(store_dir, bucket=kfp_harness.BUCKET) as store:
        with kfp_harness.KfpBackend(control_plane, store, multi_user=True) as backend:
            conftest._TIMINGS["KFP backend start (multi-user)"] = backend.started_in_s
            for profile in TEAMS:
                profile.create(control_plane)
            yield backend


def _cli(backend, *args: str, token: str | None = None, extra_env: dict[str, str] | None = None):
    import subprocess

    env = user_env(KF_PIPELINES_ENDPOINT=backend.endpoint, **({"KF_PIPELINES_TOKEN": token} if token else {}))
    env.update(extra_env or {})
    return subprocess.run(command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def _get(backend, path: str, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(f"{backend.endpoint}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 (the harness's own URL)
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_the_api_server_runs_in_multi_user_mode_with_the_profiles_made_as_upstream_makes_them(
    control_plane, multi_user_kfp
):
    pid = multi_user_kfp.procs["kfp-apiserver"].popen.pid
    environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    assert env["MULTIUSER"] == "true" and env["KUBEFLOW_USERID_HEADER"] == "kubeflow-userid"
    assert env["DEFAULTPIPELINERUNNERSERVICEACCOUNT"] == "default-editor"
    namespace = json.loads(control_plane.kubectl_ok("get", "namespace", TEAM_A.name, "-o", "json").stdout)
    assert namespace["metadata"]["labels"]["pipelines.kubeflow.org/enabled"] == "true"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespace["metadata"]["annotations"]["owner"] == TEAM_A.owner

    # The aggregation reached KFP's own rules: asked as the API server asks (a SubjectAccessReview), the
    # editor may create runs in team-a, the viewer may only read them.
    def allowed(account: str, verb: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{TEAM_A.name}:{account}",
                "resourceAttributes": {
                    "namespace": TEAM_A.name, "group": "pipelines.kubeflow.org", "resource": "runs", "verb": verb,
                },
            },
        }  # fmt: skip
        answer = control_plane.kubectl_ok("create", "-f", "-", "-o", "json", input=json.dumps(review))
        return json.loads(answer.stdout)["status"].get("allowed", False)

    assert (allowed("default-editor", "create"), allowed("default-viewer", "create")) == (True, False)
    assert allowed("default-viewer", "list")


def test_a_profiles_token_lists_its_runs_and_the_other_teams_token_is_refused_naming_the_namespace(
    control_plane, multi_user_kfp
):
    own = _cli(multi_user_kfp, "runs", "--namespace", TEAM_A.name, token=TEAM_A.token(control_plane))
    assert own.returncode == 0, own.stderr
    assert "no runs" in own.stdout

    other_token = TEAM_B.token(control_plane)
    other = _cli(multi_user_kfp, "runs", "--namespace", TEAM_A.name, token=other_token)
    assert other.returncode != 0
    message = other.stderr.strip().splitlines()[-1]
    assert "denied access to namespace 'team-a'" in message and "403" in message, other.stderr
    assert other_token not in other.stderr + other.stdout  # the token is never printed


def test_without_credentials_the_cli_is_refused_saying_how_to_log_in_and_nothing_is_created(
    multi_user_kfp,
):
    done = _cli(multi_user_kfp, "submit", "--namespace", TEAM_A.name, "--image", "registry.example/c:1")
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert "refused the request (401" in message and "pass --token or set KF_PIPELINES_TOKEN" in message
    status, body = _get(
        multi_user_kfp, f"/apis/v2beta1/runs?namespace={TEAM_A.name}", {"kubeflow-userid": TEAM_A.owner}
    )
    assert status == 200 and not json.loads(body).get("runs"), body


def test_a_token_minted_for_another_audience_is_rejected_by_the_token_review(control_plane, multi_user_kfp):
    """`kubectl create token` without --audience mints a token for the kube-apiserver itself: KFP's
    TokenReview asks for audience pipelines.kubeflow.org, and the kube-apiserver says it is not."""
    wrong = TEAM_A.token(control_plane, audience="https://kubernetes.default.svc.cluster.local")
    done = _cli(multi_user_kfp, "runs", "--namespace", TEAM_A.name, token=wrong)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "401" in message and "minted for another audience" in message, done.stderr
    assert wrong not in done.stderr + done.stdout


def test_the_gateways_userid_header_is_authorized_for_its_owners_profile_only(multi_user_kfp):
    """What the platform's gateway (oauth2-proxy behind Istio) sends: no token, only the user's name."""
    runs = "/apis/v2beta1/runs?namespace={}"
    alice = {"kubeflow-userid": TEAM_A.owner}
    assert _get(multi_user_kfp, runs.format(TEAM_A.name), alice)[0] == 200
    status, body = _get(multi_user_kfp, runs.format(TEAM_B.name), alice)
    assert status == 403, body
    assert _get(multi_user_kfp, runs.format(TEAM_B.name), {"kubeflow-userid": TEAM_B.owner})[0] == 200
    status, body = _get(multi_user_kfp, runs.format(TEAM_A.name), {})
    assert status == 401, body  # no identity at all


def test_a_viewer_may_read_but_not_create_and_an_editor_creates(control_plane, multi_user_kfp):
    import kfp
    from kfp_server_api.exceptions import ApiException

    viewer = kfp.Client(
        host=multi_user_kfp.endpoint, existing_token=TEAM_A.token(control_plane, "default-viewer")
    )
    assert viewer.list_experiments(namespace=TEAM_A.name).total_size in (None, 0)
    with pytest.raises(ApiException) as refused:
        viewer.create_experiment("viewer-cannot", namespace=TEAM_A.name)
    assert refused.value.status == 403
    editor = kfp.Client(host=multi_user_kfp.endpoint, existing_token=TEAM_A.token(control_plane))
    made = editor.create_experiment("editor-can", namespace=TEAM_A.name)
    assert made.namespace == TEAM_A.name
    listed = viewer.list_experiments(namespace=TEAM_A.name).experiments
    assert [e.display_name for e in listed] == ["editor-can"]


def test_doctor_reports_the_mode_and_the_logins_rights_in_the_profile_as_the_servers_answer(
    control_plane, multi_user_kfp
):
    def doctor_line(token: str) -> str:
        done = _cli(
            multi_user_kfp, "doctor", "--namespace", TEAM_A.name, "--kfp-namespace", "kubeflow",
            token=token, extra_env={"KUBECONFIG": str(control_plane.kubeconfig)},
        )  # fmt: skip
        (line,) = [line for line in done.stdout.splitlines() if "KFP login:" in line]
        return line

    own = doctor_line(TEAM_A.token(control_plane))
    assert own.startswith("[OK  ]") and "KFP 2.17.0, multi-user mode" in own, own
    assert "may list runs in namespace 'team-a'" in own, own
    other = doctor_line(TEAM_B.token(control_plane))
    assert other.startswith("[FAIL]") and "denied access to namespace 'team-a'" in other, other
