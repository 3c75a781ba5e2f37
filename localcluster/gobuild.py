"""Build the harness's Go binaries from Go modules, once per version, into a cache outside the repo.

`ensure_binary(name, version)` returns `<cache>/bin/<name>-<version>/<name>`, building it first when
missing. The cache is `${CIFAR10_KFP_CACHE:-~/.cache/cifar10-kfp}`. A build goes into a temporary
directory that is renamed into place, so a killed build never leaves a half-written binary; a file
lock keeps two processes from building the same binary at once. Next to each binary, build.json
records the recipe it was built from (a changed pin rebuilds it) and how long the first build took.

`python -m localcluster.gobuild --all` builds everything (used by `make cluster-build`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from localcluster import reaper, versions

GOMOD_DIR = pathlib.Path(__file__).resolve().parent / "gomod"
# Reproducible, static builds: no local paths in the binary (-trimpath), no VCS stamping, no cgo;
# -p 2 keeps a build to the two cores this machine has (a wider build runs out of memory).
_GOFLAGS = "-trimpath -buildvcs=false -p=2"
_BUILD_TIMEOUT_S = 3600


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CIFAR10_KFP_CACHE") or "~/.cache/cifar10-kfp").expanduser()


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "the Go toolchain ('go') is not on PATH; the cluster harness builds from Go modules"
        )
    return go


def _go_env(cgo: bool = False, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="1" if cgo else "0", GOFLAGS=_GOFLAGS, GOTOOLCHAIN="local")
    env.update(extra)
    return env


def _recipe(spec: versions.GoBinary) -> dict:
    recipe = dataclasses.asdict(spec)
    recipe["ldflags"] = list(spec.ldflags)
    # tags and cgo join the recipe only when set, so binaries stamped before these fields existed
    # (all cgo-free, untagged) are not rebuilt.
    recipe["tags"] = list(spec.tags)
    for field in ("tags", "cgo", "source"):
        if not recipe[field]:
            del recipe[field]
    if spec.wrapper:
        # The wrapper's go.mod/go.sum are the pin: a change to them must rebuild.
        wrapper = GOMOD_DIR / spec.wrapper
        recipe["wrapper_files"] = {p: (wrapper / p).read_text() for p in ("go.mod", "go.sum")}
    recipe["goflags"] = _GOFLAGS
    return recipe


def _run_go(args: list[str], cwd: pathlib.Path, env: dict[str, str], what: str) -> None:
    proc = subprocess.run(
        [_go(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building {what} failed: go {' '.join(args)}\n{proc.stderr[-4000:]}")


def _build_into(spec: versions.GoBinary, out_dir: pathlib.Path) -> None:
    ldflags = " ".join(("-s", "-w", *spec.ldflags))
    what = f"{spec.name} {spec.version}"
    flags = ["-ldflags", ldflags, *(["-tags", ",".join(spec.tags)] if spec.tags else [])]
    if spec.wrapper:
        wrapper = GOMOD_DIR / spec.wrapper
        args = ["build", "-mod=readonly", *flags, "-o", str(out_dir / spec.name), spec.package]
        _run_go(args, wrapper, _go_env(spec.cgo), what)
        return
    if spec.source:
        from localcluster import sources  # sources uses this module's cache helpers

        root = sources.ensure_tree(spec.source)
        rel = spec.package.removeprefix(spec.module).lstrip("/")
        args = ["build", "-mod=readonly", *flags, "-o", str(out_dir / spec.name), f"./{rel}"]
        _run_go(args, root, _go_env(spec.cgo), what)
        return
    # Built inside the module's own directory of the module cache, so its own go.mod and go.sum
    # decide every dependency, as `go install pkg@version` would. (`go install` itself is refused
    # for some modules: it lists the module's versions to look for a deprecation notice, and the
    # proxy answers 403 to that list for sigs.k8s.io/jobset.)
    module_root = module_dir(spec.module, spec.version)
    rel = spec.package.removeprefix(spec.module).lstrip("/") or "."
    args = [
        "build",
        "-mod=readonly",
        *flags,
        "-o",
        str(out_dir / spec.name),
        f"./{rel}" if rel != "." else ".",
    ]
    _run_go(args, module_root, _go_env(spec.cgo), what)


@contextlib.contextmanager
def file_lock(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stamp(target_dir: pathlib.Path) -> dict | None:
    try:
        return json.loads((target_dir / "build.json").read_text())
    except (OSError, ValueError):
        return None


def ensure_binary(name: str, version: str | None = None) -> pathlib.Path:
    """The path of binary `name` at `version` (its pinned default when None), built if missing."""
    spec = versions.spec(name, version)
    bin_root = cache_root() / "bin"
    target_dir = bin_root / f"{spec.name}-{spec.version}"
    binary = target_dir / spec.name
    recipe = _recipe(spec)
    stamp = _stamp(target_dir)
    if binary.is_file() and stamp and stamp.get("recipe") == recipe:
        return binary
    with file_lock(bin_root / f".lock-{spec.name}-{spec.version}"):
        stamp = _stamp(target_dir)
        if binary.is_file() and stamp and stamp.get("recipe") == recipe:
            return binary  # another process built it while this one waited
        tmp = reaper.temporary_dir(f".tmp-{spec.name}-", str(bin_root))
        try:
            print(
                f"gobuild: building {spec.name} {spec.version} from {spec.module} ...",
                file=sys.stderr,
                flush=True,
            )
            started = time.monotonic()
            _build_into(spec, tmp)
            seconds = round(time.monotonic() - started, 1)
            (tmp / "build.json").write_text(
                json.dumps({"recipe": recipe, "build_seconds": seconds}, indent=1)
            )
            if target_dir.exists():
                shutil.rmtree(target_dir)
            tmp.rename(target_dir)
        finally:
            reaper.remove_dir(tmp)
        print(
            f"gobuild: first build of {spec.name} {spec.version} took {seconds:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return binary


def build_seconds(name: str, version: str | None = None) -> float | None:
    """How long the cached binary's first build took (None when it is not built)."""
    spec = versions.spec(name, version)
    stamp = _stamp(cache_root() / "bin" / f"{spec.name}-{spec.version}")
    return None if stamp is None else stamp.get("build_seconds")


def module_dir(module: str, version: str) -> pathlib.Path:
    """The Go module cache directory of module@version (downloaded through the proxy if needed)."""
    with tempfile.TemporaryDirectory(prefix="gomod-") as scratch:
        proc = subprocess.run(
            [_go(), "mod", "download", "-json", f"{module}@{version}"],
            cwd=scratch,
            env=_go_env(GOFLAGS=""),
            capture_output=True,
            text=True,
            timeout=600,
        )
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise RuntimeError(
            f"go mod download {module}@{version} failed: {info.get('Error') or proc.stderr.strip()}"
        )
    return pathlib.Path(info["Dir"])


#: What one Go build of the largest binaries (kube-apiserver, kubelet) holds at its peak, linker included.
_BUILD_MEMORY_BYTES = 4 << 30


def parallel_builds(requested: int | None = None) -> int:
    """How many builds run at once: as asked, else as many as the cores and the free memory allow.

    One build already compiles packages on every core (-p); a second one fills the cores while the
    first links (single-threaded) or waits for module downloads.
    """
    if requested is not None:
        return max(1, requested)
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = _BUILD_MEMORY_BYTES
    return max(1, min(os.cpu_count() or 1, available // _BUILD_MEMORY_BYTES, 4))


def build_all(jobs: int | None = None) -> list[tuple[str, str, float | None]]:
    """Build every pinned binary that is missing, `parallel_builds(jobs)` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    pins = [(name, version) for name, by_version in versions.BINARIES.items() for version in by_version]
    missing = [pin for pin in pins if not is_built(*pin)]
    if missing:
        workers = parallel_builds(jobs)
        print(
            f"gobuild: {len(missing)} of {len(pins)} binaries to build, {workers} at a time", file=sys.stderr
        )
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for done in [pool.submit(ensure_binary, name, version) for name, version in missing]:
                done.result()  # the first failure is raised, after the builds under way finish
    return [(name, version, build_seconds(name, version)) for name, version in pins]


def is_built(name: str, version: str | None = None) -> bool:
    """Whether the cached binary exists and was built from today's recipe."""
    spec = versions.spec(name, version)
    target_dir = cache_root() / "bin" / f"{spec.name}-{spec.version}"
    stamp = _stamp(target_dir)
    return (target_dir / spec.name).is_file() and bool(stamp) and stamp.get("recipe") == _recipe(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="build every pinned binary")
    parser.add_argument("--jobs", type=int, help="builds at once (default: by cores and free memory)")
    parser.add_argument("names", nargs="*", help="NAME or NAME@VERSION to build")
    args = parser.parse_args(argv)
    if not args.all and not args.names:
        parser.error("give --all or at least one NAME[@VERSION]")
    started = time.monotonic()
    if args.all:
        rows = build_all(args.jobs)
    else:
        rows = []
        for item in args.names:
            name, _, version = item.partition("@")
            path = ensure_binary(name, version or None)
            rows.append(
                (name, path.parent.name.removeprefix(name + "-"), build_seconds(name, version or None))
            )
    for name, version, seconds in rows:
        first = "?" if seconds is None else f"{seconds:.0f} s"
        print(f"{name:28} {version:10} first build {first}")
    print(f"all present after {time.monotonic() - started:.0f} s; cache {cache_root() / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
