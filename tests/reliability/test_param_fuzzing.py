"""Part 5: pipeline parameters fuzzed with hypothesis.

For every run-time parameter of the training pipeline: invalid values (out of range, wrong
type, non-finite, malformed text) are rejected by ``validate_pipeline_params`` with a
``ValueError`` that names the parameter, and ``run_local`` refuses them before it creates a run
directory or talks to an object store, so no training starts. Values inside the documented
ranges pass. The valid ranges below are written from the parameters' own descriptions (what a
user reads in the KFP UI), not from the validator's code.
"""

from __future__ import annotations

import math
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cifar10_kfp.params.table import TRAINING_PARAMS
from cifar10_kfp.params.validation import validate_pipeline_params
from tests.reliability.harness import FIGURES, ConnectionCounter

pytestmark = pytest.mark.reliability

KIND = "pipeline parameters (hypothesis)"
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# ------------------------------------------------------------------ invalid values

not_an_int = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda x: not (math.isfinite(x) and x.is_integer())
    ),
    st.text(alphabet=string.ascii_letters + " .,", min_size=1, max_size=8),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
not_a_number = st.one_of(
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf, "nan", "inf", "-inf"]),
    st.text(alphabet=string.ascii_letters + " ,", min_size=1, max_size=8).filter(lambda s: s.strip() != ""),
    st.none(),
)
not_a_string = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())


def int_outside(lo: int, hi: int, zero_ok: bool = False):
    below = st.integers(max_value=lo - 1).filter(lambda v: not (zero_ok and v == 0))
    return st.one_of(below, st.integers(min_value=hi + 1), not_an_int)


def float_outside(lo: float, hi: float, *, lo_open: bool = False):
    below = st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False, allow_infinity=False)
    if lo_open:
        below = below.filter(lambda v: v != 0)  # 0 means "the preset's default"
    above = st.floats(min_value=hi, exclude_min=True, allow_nan=False, allow_infinity=False)
    return st.one_of(below, above, not_a_number)


bad_key = st.sampled_from(
    ["../escape", "a/../../b", "/absolute", "ctl\x01char", "nul\x00", "x" * 1100, "a/./b"]
)
bad_prefix = st.sampled_from(["../escape", "a/../../b", "ctl\x01char", "nul\x00", "x" * 1100, "a/./b"])
bad_bucket = st.sampled_from(
    ["Upper", "ab", "under_score", "-edge", "edge-", "a..b", "10.0.0.1", "x" * 64, "xn--a"]
)

bad_k8s_name = st.sampled_from(["Upper", "under_score", "-edge", "edge-", "sp ace", "a/b", "x" * 254])

INVALID = {
    "dataset_uri": st.one_of(
        st.sampled_from(
            ["", "   ", "ftp://host/x.tar.gz", "gopher://x/y", "javascript://alert", "s3://b/x\x00y"]
        ),
        not_a_string,
    ),
    "dataset_checksum": st.one_of(
        st.text(alphabet="0123456789abcdef", min_size=1, max_size=80).filter(lambda s: len(s) != 64),
        st.text(alphabet="ghijklmnopqrstuvwxyz", min_size=64, max_size=64),
        st.just("md5:" + "0" * 64),
        not_a_string,
    ),
    "val_fraction": float_outside(0.0, 0.5),
    "max_train_samples": int_outside(0, 10_000_000),
    "max_test_samples": int_outside(0, 10_000_000),
    "image_size": int_outside(8, 512),
    "skip_bad_images": int_outside(0, 1),
    "preset": st.one_of(
        st.text(max_size=12).filter(lambda s: s not in ("seed", "fast", "cpu")), not_a_string
    ),
    "architecture": st.one_of(
        st.text(min_size=1, max_size=12).filter(lambda s: s not in ("simple_cnn", "fast_resnet")),
        not_a_string,
    ),
    "epochs": int_outside(1, 10_000, zero_ok=True),
    "batch_size": int_outside(1, 65_536, zero_ok=True),
    "lr": float_outside(0.0, 10.0, lo_open=True),
    "seed": int_outside(0, 2**31 - 1),
    "extra_hparams": st.one_of(
        st.sampled_from(
            ["{", "[1, 2]", '"text"', "42", "null", '{"no_such_knob": 1}', '{"lr": "fast"}', '{"lr": -1}']
        ),
        not_a_string,
    ),
    "num_gpus": int_outside(0, 16),
    "num_nodes": int_outside(1, 64),
    "checkpoint_every": int_outside(1, 10_000, zero_ok=True),
    "checkpoint_uri": st.one_of(
        bad_key.map(lambda k: f"s3://mlpipeline/{k}"),
        bad_bucket.map(lambda b: f"s3://{b}/ck"),
        st.just("ftp://x/y"),
    ),
    "min_accuracy": float_outside(0.0, 1.0),
    "model_name": st.one_of(
        st.sampled_from(
            ["", "UPPER", "../escape", "a/b", "-lead", "trail-", "x" * 64, "sp ace", "semi;colon"]
        ),
        not_a_string,
    ),
    "bucket": st.one_of(bad_bucket, not_a_string),
    "storage_prefix": st.one_of(bad_prefix, not_a_string),  # a leading "/" is stripped, not refused
    # with num_nodes at its default 1, min_nodes above 1 is out of range too ("1..num_nodes")
    "min_nodes": st.one_of(int_outside(0, 64), st.integers(2, 64)),
    "max_restarts": int_outside(0, 100),
    "checkpoint_every_s": int_outside(0, 86_400),
    "trainjob_timeout_h": float_outside(0.0, 720.0, lo_open=True),
    "keep_trainjob": int_outside(0, 1),
    "service_account": st.one_of(bad_k8s_name, not_a_string),
    "image_pull_secrets": st.one_of(bad_k8s_name, bad_k8s_name.map(lambda n: "regcred," + n), not_a_string),
}

# -------------------------------------------------------------------- valid values

safe_key = st.lists(st.text(alphabet=string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=8), min_size=1, max_size=3).map("/".join)  # fmt: skip
VALID = {
    "dataset_uri": st.one_of(
        safe_key.map(lambda k: f"https://example.org/{k}.tar.gz"),
        safe_key.map(lambda k: f"s3://mlpipeline/{k}.tar.gz"),
        safe_key.map(lambda k: f"/data/{k}.tar.gz"),
    ),
    "dataset_checksum": st.one_of(
        st.just(""),
        st.text(alphabet="0123456789abcdefABCDEF", min_size=64, max_size=64),
        st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(lambda h: "sha256:" + h),
        st.text(alphabet="0123456789abcdef", min_size=32, max_size=32).map(lambda h: "md5:" + h),
    ),
    "val_fraction": st.floats(0.0, 0.5),
    "max_train_samples": st.integers(0, 10_000_000),
    "max_test_samples": st.integers(0, 10_000_000),
    "image_size": st.integers(8, 512),
    "skip_bad_images": st.integers(0, 1),
    "preset": st.sampled_from(["seed", "fast", "cpu"]),
    "architecture": st.sampled_from(["", "simple_cnn", "fast_resnet"]),
    "epochs": st.integers(0, 10_000),
    "batch_size": st.integers(0, 65_536),
    "lr": st.one_of(st.just(0.0), st.floats(0.0, 10.0, exclude_min=True)),
    "seed": st.integers(0, 2**31 - 1),
    "extra_hparams": st.one_of(
        st.just(""),
        st.floats(0.0, 0.01).map(lambda v: f'{{"weight_decay": {v!r}}}'),
        st.floats(0.0, 0.5).map(lambda v: f'{{"label_smoothing": {v!r}}}'),
    ),
    "num_gpus": st.integers(0, 16),
    "num_nodes": st.integers(1, 64),
    "checkpoint_every": st.integers(0, 10_000),
    "checkpoint_uri": st.one_of(st.just(""), safe_key.map(lambda k: f"s3://mlpipeline/{k}")),
    "min_accuracy": st.floats(0.0, 1.0),
    "model_name": st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?\Z"),
    "bucket": st.one_of(st.just(""), st.sampled_from(["mlpipeline", "my-bucket", "team.models"])),
    "storage_prefix": st.one_of(st.just(""), safe_key.map(lambda k: k + "/")),
    "min_nodes": st.integers(0, 1),
    "max_restarts": st.integers(0, 100),
    "checkpoint_every_s": st.integers(0, 86_400),
    "trainjob_timeout_h": st.floats(0.0, 720.0, exclude_min=True),
    "keep_trainjob": st.integers(0, 1),
    "service_account": st.one_of(st.just(""), st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")),
    "image_pull_secrets": st.one_of(
        st.just(""),
        st.lists(st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z"), min_size=1, max_size=3).map(
            ",".join
        ),
    ),
}

PARAM_NAMES = [p.name for p in TRAINING_PARAMS]


def test_every_parameter_has_strategies():
    assert sorted(INVALID) == sorted(PARAM_NAMES) == sorted(VALID)


@pytest.mark.parametrize("name", PARAM_NAMES)
def test_invalid_values_are_rejected_naming_the_parameter(name):
    @FUZZ
    @given(value=INVALID[name])
    def check(value):
        with pytest.raises(ValueError) as err:
            validate_pipeline_params({name: value})
        named = name in str(err.value)
        FIGURES.record_rejection(KIND, named)
        assert named, f"the error for {name}={value!r} does not name the parameter: {err.value}"

    check()


@pytest.mark.parametrize("name", PARAM_NAMES)
def test_valid_values_pass(name):
    @FUZZ
    @given(value=VALID[name])
    def check(value):
        validate_pipeline_params({name: value})
        FIGURES.input(KIND).accepted_valid += 1

    check()


def test_unknown_parameters_are_rejected_by_name():
    @FUZZ
    @given(
        name=st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=20).filter(
            lambda n: n not in PARAM_NAMES
        )
    )
    def check(name):
        with pytest.raises(ValueError, match=name):
            validate_pipeline_params({name: 1})
        FIGURES.record_rejection(KIND, True)

    check()


def test_run_local_refuses_invalid_parameters_before_anything_starts(tmp_path, monkeypatch):
    """No run directory, no object store, no step: the refusal comes first."""
    from cifar10_kfp_pipelines.local import run_local

    counter = ConnectionCounter()  # a store endpoint that counts anyone who connects
    monkeypatch.setenv("MINIO_ENDPOINT", counter.endpoint)
    monkeypatch.setenv("MINIO_ACCESS_KEY", "RELTESTAKUNUSED")
    monkeypatch.setenv("MINIO_SECRET_KEY", "unused-secret")
    output_root = tmp_path / "runs"

    @settings(
        max_examples=3,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def check(data):
        name = data.draw(st.sampled_from(PARAM_NAMES))
        value = data.draw(INVALID[name])
        with pytest.raises(ValueError) as err:
            run_local("training", {name: value}, output_root=output_root)
        rejected = name in str(err.value) and not output_root.exists() and counter.count == 0
        FIGURES.record_rejection(KIND, rejected)
        assert rejected, f"run_local({name}={value!r}): {err.value}; started={output_root.exists()}"

    try:
        check()
    finally:
        counter.close()
