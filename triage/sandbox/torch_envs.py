"""Torch releases other than the one triage runs with: one cached installation per release.

An arm such as ``cpu/compile@2.15.0`` (or every item of ``triage sweep --torch 2.13.0,2.15.0``)
runs its worker with another interpreter: a virtual environment under
``<cache>/torch-envs/<version>/`` made with the ordinary installers (``python -m venv``, then
``pip install torch==<version> numpy==<ours>``, honouring the user's pip configuration: index,
find-links, proxy).  The arm's sandbox is the same; the jail mounts that environment read-only
(jail.interpreter_paths) and the fork server, which holds triage's own torch, spawns such arms
instead of forking them.

The worker in the environment must be this very triage (the job and reply formats are
private), so the environment gets a copy of this triage package, no dependencies: the worker
needs only torch and numpy.  Each copy lives in its own folder named by the digest of the
package's files, put on the environment's path by a ``.pth`` file that is replaced atomically:
an arm that already started keeps the copy it imported, a newer triage adds its own.

A release named is always its own environment, even where triage runs with that version: the
installation triage runs with may be a local build, a nightly or a patched copy of the same
version number, and "does 2.13.0 reproduce it" means the release as the index serves it (pip
picks a local wheel of it where its configuration points at one).  Building takes a lock per
release, so parallel sweeps or Ray tasks on one node build it once; a failed build leaves
nothing behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from triage.sandbox.caches import cache_root
from triage.untrusted import UntrustedOutput, read_json

# PEP 440 versions as PyPI publishes torch's (2.15.0, 2.16.0rc1, 2.15.0.post1, 2.14.1+cpu):
# no paths, no requirement operators, nothing pip would read as an option.
VERSION = re.compile(r"\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?")
INSTALL_TIMEOUT_S = 3600.0  # a CUDA build of torch is several GB from the index
CHECK_TIMEOUT_S = 300.0
OLDEST = (2, 4)  # pyproject's torch>=2.4: the worker uses dispatch-mode and dynamo APIs of that age
MARKER = "triage-env.json"
PTH = "triage-worker.pth"
OLD_COPIES_S = 86400  # copies of older triage versions kept this long for arms still running them


class TorchEnvError(RuntimeError):
    """A release that cannot be had: a malformed version, or an installation that failed
    (the message ends with the installer's own last lines)."""


@dataclasses.dataclass(frozen=True)
class TorchEnv:
    """A torch installation an arm can run on: `python` runs triage's worker with it."""

    version: str  # as asked for ("2.15.0"), or the running torch's own version
    python: str
    build: str  # what results are keyed by: version with its local tag, and the commit
    running: bool = False  # the installation triage itself runs with


# Zero-width characters: triage's own comments and reports put one after every "@" (no
# @mention), so an arm spec copied from them carries it.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))


def release_version(text: str) -> str:
    """`text` as a torch release to install, or TorchEnvError saying what is wrong with it."""
    version = text.translate(_INVISIBLE).strip().lower()
    if not VERSION.fullmatch(version):
        raise TorchEnvError(f"'{text}' is not a torch release version (e.g. 2.15.0)")
    if tuple(int(n) for n in version.split(".")[:2]) < OLDEST:
        raise TorchEnvError(f"torch {version} is older than triage's worker supports "
                            f"({'.'.join(map(str, OLDEST))} or newer)")
    return version


def running_env() -> TorchEnv:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    return TorchEnv(version=version, python=sys.executable, build=running_build(), running=True)


def running_build() -> str:
    """This installation's torch, as a result key names it: the version (with its local build
    tag, e.g. ``+cpu`` or ``+cu128``) and the commit it was built from.  Read from the
    installed files, without importing torch."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "torch not installed"
    spec = importlib.util.find_spec("torch")
    folder = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
    return _build_label(version, folder)


def _build_label(version: str, torch_folder: str | None) -> str:
    git = None
    if torch_folder:
        try:
            text = (Path(torch_folder) / "version.py").read_text()
            found = re.search(r"^git_version\s*=\s*['\"]([0-9a-f]{7,40})['\"]", text, re.M)
            git = found.group(1)[:12] if found else None
        except OSError:
            pass
    return f"{version} (git {git})" if git else version


def envs_root(cache_dir: str | None = None) -> Path:
    return cache_root(cache_dir) / "torch-envs"


def torch_env(version: str, cache_dir: str | None = None, log: Callable[[str], None] | None = None) -> TorchEnv:
    """The cached environment of torch `version`, built (or given this triage's worker) first
    where needed."""
    version = release_version(version)
    root = envs_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / version
    with _locked(root / f"{version}.lock", log, version):
        marker = _environment(folder)
        if marker is None:
            if log and os.path.lexists(folder):
                log(f"the environment of torch {version} in {folder} is not a finished build triage can use "
                    f"(its {MARKER} is missing, unreadable or names paths outside it); building it again")
            _build(folder, version, log)
            marker = _environment(folder)
        if marker is None:
            raise TorchEnvError(f"the environment of torch {version} in {folder} has no usable {MARKER}")
        _install_worker(folder, folder / marker["purelib"])
    return TorchEnv(version=version, python=str(folder / "bin" / "python"), build=marker["build"])


def interpreters_for(releases: list[str | None], cache_dir: str | None = None,
                     log: Callable[[str], None] | None = None) -> dict[str, str]:
    """`RunSettings.interpreters` for arms on these releases (None: the running torch):
    release → interpreter, each environment built first where it is missing."""
    return {release: torch_env(release, cache_dir, log).python for release in dict.fromkeys(r for r in releases if r)}


MAX_MARKER_BYTES = 64 << 10
_BUILD_LABEL = re.compile(r"[\x20-\x7e]{1,200}")  # printable ASCII: a result key and a report field


def _marker(folder: Path) -> dict[str, str] | None:
    """What the build recorded, None where there is no finished build (or its record is
    unreadable or not what `_build` writes: the folder is then built again). The record is
    a file in the cache, not trusted: `purelib` must be a relative path that stays inside
    `folder` (triage writes its .pth file there), `build` a short printable label."""
    try:
        marker = read_json(folder / MARKER, MAX_MARKER_BYTES)
    except UntrustedOutput:
        return None
    if not isinstance(marker, dict):
        return None
    purelib, build = marker.get("purelib"), marker.get("build")
    if not isinstance(purelib, str) or not isinstance(build, str) or not _BUILD_LABEL.fullmatch(build):
        return None
    if not purelib or "\0" in purelib or os.path.isabs(purelib) or len(purelib) > 4096:
        return None
    relative = os.path.normpath(purelib)
    if relative == "." or relative.split(os.sep)[0] == os.pardir:
        return None
    return dict(marker, purelib=relative)


def _environment(folder: Path) -> dict[str, str] | None:
    """`_marker(folder)` where the folder holds what it says: a real directory (not a link),
    its `purelib` a directory inside it once links are followed, and an interpreter."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
    except OSError:
        return None
    marker = _marker(folder)
    if marker is None:
        return None
    real = os.path.realpath(folder)
    purelib = os.path.realpath(folder / marker["purelib"])
    if os.path.commonpath([real, purelib]) != real or purelib == real or not os.path.isdir(purelib):
        return None
    if not os.access(folder / "bin" / "python", os.X_OK):
        return None
    return marker


@contextlib.contextmanager
def _locked(path: Path, log: Callable[[str], None] | None, version: str) -> Iterator[None]:
    with open(path, "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log:
                log(f"waiting for another triage that is installing torch {version}")
            fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _build(folder: Path, version: str, log: Callable[[str], None] | None) -> None:
    """venv + pip into a temporary folder, checked, then renamed into place: a build that fails
    or is killed never looks finished.  (A venv's interpreter finds its site-packages from its
    own path, so the rename is safe; only console scripts' shebangs would be stale, and triage
    runs `python -m` only.)"""
    staging = folder.with_name(f".{version}.{os.getpid()}.building")
    shutil.rmtree(staging, ignore_errors=True)
    for stale in folder.parent.glob(f".{version}.*.building"):
        shutil.rmtree(stale, ignore_errors=True)  # a build killed earlier; the lock says none runs now
    shutil.rmtree(folder, ignore_errors=True)
    numpy = _numpy_version()
    if log:
        log(f"installing torch {version} into {folder} (python -m venv, pip install torch=={version} "
            f"numpy=={numpy}; a CUDA build is several GB)")
    try:
        _step([sys.executable, "-m", "venv", str(staging)], "python -m venv", 300.0)
        python = str(staging / "bin" / "python")
        _step([python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               f"torch=={version}", f"numpy=={numpy}"], f"pip install torch=={version}", INSTALL_TIMEOUT_S)
        probe = _step([python, "-I", "-c", _PROBE], "checking the installation", CHECK_TIMEOUT_S)
        found = json.loads(probe.splitlines()[-1])
        if found["version"].split("+")[0] != version.split("+")[0]:
            raise TorchEnvError(f"pip installed torch {found['version']} where {version} was asked for")
        marker = {"version": version, "installed": found["version"],
                  "purelib": os.path.relpath(found["purelib"], staging),  # the folder is renamed next
                  "build": _build_label(found["version"], found["torch"]), "numpy": numpy,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (staging / MARKER).write_text(json.dumps(marker, indent=1))
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# Run in the new environment: torch must import there (a CUDA build imports without a GPU),
# and where its files are is read back for the build label and the worker's copy.
_PROBE = """
import json, os, sysconfig, torch, numpy
print(json.dumps({"version": torch.__version__, "torch": os.path.dirname(torch.__file__),
                  "purelib": sysconfig.get_paths()["purelib"]}))
"""


def _step(argv: list[str], what: str, timeout_s: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TorchEnvError(f"{what} did not finish within {timeout_s:.0f} s") from None
    except OSError as e:
        raise TorchEnvError(f"{what} could not start: {e}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines()
                 if line.strip() and not line.startswith("WARNING: Location")]
        tail = " | ".join(lines[-3:])[:600] or f"exit status {done.returncode}"
        raise TorchEnvError(f"{what} failed: {tail}")
    return done.stdout


def _numpy_version() -> str:
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        raise TorchEnvError("numpy is not installed with triage; the worker needs it") from None


def _install_worker(folder: Path, purelib: Path) -> None:
    """This triage package in the environment, in a folder of its own digest, made current
    by rewriting the .pth file in one rename; copies unused for a day are removed."""
    digest = package_digest()
    copies = folder / "triage-worker"
    target = copies / digest
    # Checked, not trusted: under the process sandbox an arm runs as this user and could have
    # rewritten the copy it ran from, which every later arm on this release would run.
    if not (target / "triage").is_dir() or _digest_of(target / "triage") != digest:
        staging = copies / f".{digest}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(_package_dir(), staging / "triage", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(staging, target)
    pth = purelib / PTH
    if not pth.is_file() or pth.read_text().strip() != str(target):
        tmp = pth.with_name(f".{PTH}.{os.getpid()}")
        tmp.write_text(f"{target}\n")
        os.replace(tmp, pth)
    now = time.time()
    for other in copies.iterdir():
        if other != target and now - other.stat().st_mtime > OLD_COPIES_S:
            shutil.rmtree(other, ignore_errors=True)
    os.utime(target)


def _package_dir() -> str:
    import triage

    return os.path.dirname(os.path.abspath(triage.__file__))


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """The digest of this triage package's files (names and bytes; no bytecode caches)."""
    return _digest_of(Path(_package_dir()))


def _digest_of(base: Path) -> str:
    """Every file counts, not only sources: an extension module beside `x.py` would be
    imported in its place."""
    h = hashlib.sha256()
    for path in sorted(p for p in base.rglob("*") if p.is_file() or p.is_symlink()):
        if "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
