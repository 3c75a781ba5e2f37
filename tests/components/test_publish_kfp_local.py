"""evaluate -> gate -> publish as a kfp.local pipeline (SubprocessRunner, no venv) on the embedded store.

kfp.local 2.17.3 cannot evaluate ``dsl.If`` on one output of a multi-output (NamedTuple) task: the
condition's channel ``pipelinechannel--gate-model-passed`` is looked up as a parent input and the
branch is silently skipped. A condition on a single-output task works, so the branch here is
gated on ``passed_flag(passed)`` (a pass-through); on a cluster both forms work.
"""

import json

import pytest


@pytest.mark.slow
def test_evaluate_gate_publish_under_kfp_local(store_env, trained_model_dir, tiny_dataset_path, tmp_path):  # noqa: F811
    from kfp import dsl, local

    from cifar10_kfp.publish.registry import latest_version
    from cifar10_kfp_components.evaluate import evaluate_model
    from cifar10_kfp_components.publish import gate_model, publish_model

    store_env.ensure_bucket()

    @dsl.component(base_image="python:3.11")
    def passed_flag(passed: bool) -> bool:
        return passed

    @dsl.pipeline(name="evaluate-and-publish")
    def evaluate_and_publish(model_uri: str, dataset_uri: str, history_uri: str, min_accuracy: float):
        model = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=True)
        data = dsl.importer(artifact_uri=dataset_uri, artifact_class=dsl.Dataset, reimport=True)
        history = dsl.importer(artifact_uri=history_uri, artifact_class=dsl.Artifact, reimport=True)
        evaluation = evaluate_model(
            model=model.output, dataset=data.output, history=history.output, tta=True
        ).set_caching_options(False)
        gate = gate_model(
            model=model.output, dataset=data.output, test_accuracy=evaluation.outputs["test_accuracy"],
            min_accuracy=min_accuracy, model_name="local-run", bucket="", storage_prefix="",
        ).set_caching_options(False)  # fmt: skip
        flag = passed_flag(passed=gate.outputs["passed"]).set_caching_options(False)
        with dsl.If(flag.output == True):  # noqa: E712 - a KFP condition
            publish_model(
                model=model.output, dataset=data.output, gate_decision=gate.outputs["decision"],
                test_accuracy=evaluation.outputs["test_accuracy"],
                test_accuracy_plain=evaluation.outputs["test_accuracy_plain"], model_name="local-run",
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, bucket="", storage_prefix="", model_registry_url="",
                image="local",
            ).set_caching_options(False)  # fmt: skip

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp-root"))
    args = dict(
        model_uri=str(trained_model_dir),
        dataset_uri=str(tiny_dataset_path),
        history_uri=str(tmp_path / "history.json"),
    )
    evaluate_and_publish(**args, min_accuracy=0.5)
    first = latest_version("local-run", store=store_env)
    assert first is not None and first["metrics"]["test_accuracy"] > 0.6

    evaluate_and_publish(**args, min_accuracy=0.5)  # same model again: an equal challenger is not published
    assert latest_version("local-run", store=store_env) == first

    reports = list((tmp_path / "kfp-root").rglob("report*"))
    assert reports, "the HTML report artifact was not written"
    decisions = [json.loads(p.read_text()) for p in (tmp_path / "kfp-root").rglob("decision") if p.is_file()]
    assert sorted(d["passed"] for d in decisions) == [False, True]
