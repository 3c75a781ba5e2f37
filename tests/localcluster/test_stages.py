"""The closing table of `make test-cluster` says `passed` for a stage only when all of it ran and passed."""

from tests.cluster.stages import STAGES, stage_verdict

STAGE = {"test_dns", "test_trainjob"}


def test_a_stage_passes_only_when_every_scenario_ran_and_passed():
    both = [("test_dns", "passed", 1.0), ("test_trainjob[2.3]", "passed", 2.0)]
    assert stage_verdict(STAGE, both) == "passed (2 results)"


def test_a_stage_with_a_scenario_that_did_not_run_is_not_proven():
    # a deselected scenario, or one that -x never reached: no result at all
    assert stage_verdict(STAGE, [("test_dns", "passed", 1.0)]) == "not proven: test_trainjob did not run"
    assert stage_verdict(STAGE, [("test_other", "passed", 1.0)]) == "not run"


def test_a_failure_in_setup_or_teardown_or_a_skip_fails_the_stage():
    ran = [("test_dns", "passed", 1.0), ("test_trainjob[2.3]", "passed", 2.0)]
    assert (
        stage_verdict(STAGE, [*ran, ("test_trainjob[2.3]", "failed in teardown", 0.1)])
        == "failed in teardown"
    )
    assert (
        stage_verdict(STAGE, [("test_dns", "passed", 1.0), ("test_trainjob[2.2]", "skipped", 0.0)])
        == "skipped"
    )


def test_every_stage_names_scenarios():
    assert all(scenarios for _, scenarios in STAGES)
