"""Write (or check) the image's dependency list from pyproject.toml: ``[project.dependencies]`` and ``IMAGE_EXTRAS``.

The image installs its dependencies in a layer of their own, before our code, so that a code change
rebuilds only the last, small layer. That layer needs the list as a plain requirements file, and the
list must be exactly pyproject's, or the image would run with something the tests never saw. The image
also has the optional extras in ``IMAGE_EXTRAS`` (``tracking``: the MLflow client, for KFP 2.17's MLflow
integration), installed the same way.

    python images/train/requirements.py > images/train/requirements.txt   # regenerate
    python images/train/requirements.py --check                           # exit 1 on drift

Standard library only: the Docker builder stage runs ``--check`` before building the wheel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parents[1] / "pyproject.toml"
REQUIREMENTS = HERE / "requirements.txt"
IMAGE_EXTRAS = ("tracking",)
HEADER = (
    "# Generated from pyproject.toml [project.dependencies] and the extras images/train/requirements.py\n"
    "# names (IMAGE_EXTRAS) by that script; do not edit.\n"
    "# tests/images/test_train_image.py and the image build fail when the two differ.\n"
)


def pyproject_dependencies(pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement strings of ``[project.dependencies]`` and of the extras in ``IMAGE_EXTRAS``, as written."""
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    extras = [req for name in IMAGE_EXTRAS for req in project["optional-dependencies"][name]]
    return list(project["dependencies"]) + extras


def read_requirements(path: Path = REQUIREMENTS) -> list[str]:
    """The requirement lines of a requirements file, without comments or blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def render(dependencies: list[str]) -> str:
    return HEADER + "".join(f"{dep}\n" for dep in dependencies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare requirements.txt with pyproject.toml")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    args = parser.parse_args(argv)
    expected = pyproject_dependencies(args.pyproject)
    if not args.check:
        sys.stdout.write(render(expected))
        return 0
    actual = read_requirements(args.requirements)
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    if missing or extra:
        print(
            f"{args.requirements} differs from {args.pyproject} [project.dependencies] + extras {list(IMAGE_EXTRAS)}: "
            f"missing {missing}, extra {extra}. Regenerate: python images/train/requirements.py > {REQUIREMENTS.name}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
