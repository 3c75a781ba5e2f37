"""The stages of issue 24 ("the pipeline runs for real"), issue 34's clean stop, issue 35's KFP UI and issue 36's
multi-user KFP, and the scenarios of `make test-cluster` that show each one; the closing table prints a result
per stage (tests/cluster/conftest.py)."""

from __future__ import annotations

STAGES: list[tuple[str, set[str]]] = [
    ("1 a real node (kubelet, containerd, runc, CNI)", {
        "test_real_node_registers_with_pinned_versions", "test_pod_runs_to_succeeded_on_the_real_node",
        "test_failing_container_fails_the_pod_with_its_exit_code", "test_pod_reaches_the_host_through_the_bridge",
    }),
    ("2 images without a registry", {
        "test_pod_runs_to_succeeded_on_the_real_node", "test_standalone_train_job_completes_on_the_real_node",
        "test_a_training_run_succeeds_on_real_pods",
    }),
    ("3.1 the standalone Job", {"test_standalone_train_job_completes_on_the_real_node"}),
    ("3.2 a 2-node TrainJob on real pods (gloo)", {
        "test_pods_resolve_a_headless_service_name", "test_a_two_node_trainjob_completes_on_real_pods_with_a_model",
    }),
    ("3.3 a KFP run SUCCEEDED on real pods", {"test_a_training_run_succeeds_on_real_pods"}),
    ("3.3 a recurring run fired and succeeded", {"test_a_recurring_run_fires_on_schedule_and_its_run_succeeds"}),
    ("3.3 the notebook's cluster path", {"test_the_notebooks_cluster_path_submits_a_run_that_succeeds"}),
    ("3.4 the Workflow the real backend made", {
        "test_training_workflow_keeps_gpu_secrets_retries_and_caching", "test_no_cache_submission_caches_nothing",
        "test_other_pipelines_keep_secrets_on_every_step",
    }),
    ("35 KFP UI in a browser", {
        "test_ui_uploads_the_pipeline_and_draws_its_dag",
        "test_ui_run_form_offers_every_parameter_and_starts_a_tiny_run",
        "test_ui_recurring_run_from_the_form",
        "test_ui_bad_value_typed_into_the_form_fails_validate_with_its_message",
        "test_ui_follows_the_tiny_run_its_steps_turn_green_and_train_logs_epochs",
        "test_ui_evaluate_step_shows_metrics_confusion_matrix_report_and_markdown",
        "test_ui_recurring_runs_first_run_succeeds_and_compares_with_the_tiny_run",
    }),
    ("36 multi-user KFP: profiles, real TokenReview and SubjectAccessReview", {
        "test_the_api_server_runs_in_multi_user_mode_with_the_profiles_made_as_upstream_makes_them",
        "test_a_profiles_token_lists_its_runs_and_the_other_teams_token_is_refused_naming_the_namespace",
        "test_without_credentials_the_cli_is_refused_saying_how_to_log_in_and_nothing_is_created",
        "test_a_token_minted_for_another_audience_is_rejected_by_the_token_review",
        "test_the_gateways_userid_header_is_authorized_for_its_owners_profile_only",
        "test_a_viewer_may_read_but_not_create_and_an_editor_creates",
        "test_doctor_reports_the_mode_and_the_logins_rights_in_the_profile_as_the_servers_answer",
    }),
    ("34.6 make cluster stops clean (INT/KILL)", {"test_make_cluster_stops_clean"}),
    ("34.6 make cluster-full stops clean (KILL)", {"test_make_cluster_full_stops_clean_when_killed"}),
    ("34.6 make model-registry stops clean (TERM/KILL)", {"test_make_model_registry_stops_clean"}),
]  # fmt: skip


def stage_verdict(scenarios: set[str], results: list[tuple[str, str, float]]) -> str:
    """`passed` only when every scenario of the stage ran and each of its results passed: a scenario that
    was deselected, never reached (-x) or failed in setup or teardown leaves the stage unproven."""
    outcomes = [(name.split("[", 1)[0], o) for name, o, _ in results if name.split("[", 1)[0] in scenarios]
    missing = sorted(scenarios - {name for name, _ in outcomes})
    failed = [o for _, o in outcomes if o != "passed"]
    if failed:
        return failed[0]
    if missing:
        return f"not proven: {', '.join(missing)} did not run" if outcomes else "not run"
    return f"passed ({len(outcomes)} results)"
