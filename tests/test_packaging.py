"""The wheel a user installs: unique top-level import names, every package and the compiled specs inside.

The top-level folders ``components/`` and ``pipelines/`` are installed as ``cifar10_kfp_components``
and ``cifar10_kfp_pipelines`` (pyproject's ``package-dir``): generic names such as ``components``
would collide with other projects in a user's site-packages.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

EXPECTED_TOP_LEVEL = {"cifar10_kfp", "cifar10_kfp_components", "cifar10_kfp_pipelines"}
# folder in the repository -> the import name it is installed under
INSTALLED_AS = {
    "cifar10_kfp": "cifar10_kfp",
    "components": "cifar10_kfp_components",
    "pipelines": "cifar10_kfp_pipelines",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("cifar10_kfp-*.whl")
    return found


def _source_packages() -> set[str]:
    """Every package in the source tree, by the name it must be installed under."""
    names = set()
    for folder, name in INSTALLED_AS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            names.add(".".join((name, *relative)))
    return names


def test_wheel_installs_only_unique_top_level_names(wheel, tmp_path):
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    before = {p.name for p in site.iterdir()}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    added = {p.name for p in site.iterdir()} - before
    top_level = {
        name for name in added if not name.endswith((".dist-info", ".pth")) and name != "__pycache__"
    }
    assert top_level == EXPECTED_TOP_LEVEL
    assert not {"components", "pipelines", "tests", "benchmarks"} & top_level


def test_wheel_holds_every_package_and_the_compiled_specs(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == _source_packages(), "pyproject's [tool.setuptools] packages list is out of date"
    compiled = {n for n in names if n.startswith("cifar10_kfp_pipelines/compiled/") and n.endswith(".yaml")}
    assert compiled == {
        f"cifar10_kfp_pipelines/compiled/{p.name}" for p in (ROOT / "pipelines" / "compiled").glob("*.yaml")
    }
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "cifar10-kfp = cifar10_kfp_pipelines.cli:main" in archive.read(entry_points).decode()


def test_no_source_imports_the_generic_folder_names():
    """Inside the repository the folders are importable by their folder names too; nothing may rely on it."""
    offenders = []
    for path in ROOT.glob("**/*.py"):
        if any(part in (".venv", ".git", "compiled") for part in path.parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith(
                ("from components", "from pipelines", "import components", "import pipelines")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert not offenders, "\n".join(offenders)


def _pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, version in pins.items()}


def test_constraints_pin_every_requirement_to_a_version_it_allows():
    """`make install` installs constraints.txt's versions: a pin outside pyproject's range would make
    pip refuse the install, and a requirement without a pin would float to each day's release."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = [*project["dependencies"], *extras["local"], *extras["dev"], *extras["tracking"]]
    pins = _pins()
    for spec in specs:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        if name == "cifar10-kfp":  # the dev extra's own [tracking]
            continue
        assert name in pins, f"{requirement.name} has no pin in constraints.txt (make lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pins[name]}, outside pyproject's {spec!r} (make lock)"
        )


def test_make_install_installs_the_pinned_versions():
    install = subprocess.run(
        ["make", "-n", "--always-make", "install"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "-c constraints.txt -e '.[local,dev]'" in install.replace("\\\n", " ").replace("\t", ""), install
