"""What outlives a run: kept where arms cannot write it, or scoped to the script that wrote it.

- collect_env's text is cached a day, but only text that triage's parent obtained from a
  jailed process running `torch.utils.collect_env` and nothing else: never what an arm
  reports (the script runs in the arm and could forge it for every later run).
- inductor's (and triton's) compile cache is one directory per script, keyed by the script's
  bytes, the interpreter, torch and the CPU capability: a later run of the *same* script
  reuses it, so a script can only poison its own later results — which it can forge anyway.
  What an arm may write there is never trusted outside an arm: the folder triage mounts
  (`<key>/inductor`, and `<key>/default` for inductor's default folder) are made by triage
  in a folder no arm can write, so a script cannot swap one for a link to a host folder
  (which bubblewrap or the fork server would then mount writable); each is checked with
  lstat before every mount.  The caches are bounded: a script's cache above
  COMPILE_CACHE_SCRIPT_BYTES after its run is emptied, and all of them together are kept
  under COMPILE_CACHE_TOTAL_BYTES (least recently used first), beside the 7-day age limit.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from triage.sandbox.environment import scrubbed_environment
from triage.sandbox.jail import Confinement, Isolation
from triage.sandbox.process import Limits, disk_usage, run_isolated
from triage.untrusted import remove_tree

COMPILE_CACHE_TTL_S = 7 * 86400
COMPILE_CACHE_SCRIPT_BYTES = 1 << 30  # inductor's cache of one script is megabytes; more was written on purpose
COMPILE_CACHE_TOTAL_BYTES = 4 << 30
WARM_UP_CACHE_BYTES = 64 << 20  # the probe libraries are a few hundred KiB
# Part of every cache key: a folder of an earlier layout (where the script could write the
# folder triage mounts) is never reused; the age and size limits remove it.
COMPILE_CACHE_LAYOUT = "2"
COLLECT_ENV_SOURCE = "from torch.utils import collect_env\nprint(collect_env.get_pretty_env_info())"


def cache_root(directory: str | None = None) -> Path:
    return Path(directory or os.environ.get("TRIAGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "triage"))


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


class EnvironmentCache:
    """collect_env text, per interpreter + torch version + host, for a day.  `python`: another
    torch release's interpreter (sandbox/torch_envs.py), whose environment is its own: its
    path names the release."""

    TTL_S = 86400

    def __init__(self, directory: str | None = None, python: str | None = None) -> None:
        self.dir = cache_root(directory)
        python = None if python == sys.executable else python
        key = f"{python or sys.executable}|{'' if python else _torch_version()}|{os.uname().nodename}"
        self.path = self.dir / f"collect_env-{hashlib.sha256(key.encode()).hexdigest()[:16]}.txt"

    def get(self) -> str | None:
        try:
            if time.time() - self.path.stat().st_mtime < self.TTL_S:
                return self.path.read_text()
        except OSError:
            pass
        return None

    def put(self, text: str) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(self.path)
        except OSError:
            pass


def collect_environment(isolation: Isolation, timeout_s: float, accelerators: bool,
                        python: str | None = None) -> tuple[str | None, str | None]:
    """(collect_env text, why it is missing): run in a jailed process of its own that runs no
    issue code, so the text can be cached and shown for later runs.  `python`: the
    interpreter whose environment it is (None: triage's own)."""
    scratch = tempfile.mkdtemp(prefix="triage-env-")
    try:
        jail = Confinement(scratch=scratch, workdir=os.path.join(scratch, "work"), accelerators=accelerators)
        outcome = run_isolated([python or sys.executable, "-I", "-c", COLLECT_ENV_SOURCE], jail=jail,
                               env=scrubbed_environment(), isolation=isolation,
                               limits=Limits(timeout_s=timeout_s, memory_bytes=4 << 30, output_bytes=256 << 10))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if outcome.exit_code == 0 and outcome.stdout.strip():
        return outcome.stdout, None
    if outcome.timed_out:
        return None, f"collect_env did not finish within {timeout_s:.0f} s"
    last = (outcome.stderr.strip().splitlines() or [f"exit status {outcome.exit_code}"])[-1]
    return None, f"collect_env failed: {last[:300]}"


def compile_cache(source: str, directory: str | None = None) -> str:
    """The compile cache of this script (TORCHINDUCTOR_CACHE_DIR), created; old and oversized
    caches of other scripts pruned."""
    key = "|".join([COMPILE_CACHE_LAYOUT, source, sys.executable, _torch_version(),
                    os.environ.get("ATEN_CPU_CAPABILITY", "")])
    base = cache_root(directory) / "compile"
    holder = base / hashlib.sha256(key.encode()).hexdigest()[:24]
    base.mkdir(parents=True, exist_ok=True)
    own_directory(str(holder))
    os.utime(holder)
    _prune(base, keep=holder)
    return own_directory(str(holder / "inductor"))


# A run's claim on its script's compile cache: the cache path -> the open lock it holds.
_CLAIMS: dict[str, int] = {}
PRIVATE_PREFIX = "run-"


def claim_compile_cache(source: str, directory: str | None = None) -> str:
    """The script's compile cache for one triage run, held for it until `release_compile_cache`.
    Two runs of one script at once (two sweeps, two CI workers) would compile into one folder,
    and one loaded a kernel library the other was still writing ("file too short"): a run that
    finds the cache held compiles in a private one, removed at its end."""
    shared = compile_cache(source, directory)
    locks = cache_root(directory) / "compile-locks"
    locks.mkdir(parents=True, exist_ok=True)
    path = locks / (Path(shared).parent.name + ".lock")
    while True:
        lock = os.open(str(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            private = tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=str(cache_root(directory) / "compile"))
            return own_directory(os.path.join(private, "inductor"))
        if _still_named(lock, path):
            break
        os.close(lock)  # a prune removed the file between our open and our lock: the claim is on the new one
    _CLAIMS[shared] = lock
    _drop_cut_libraries(shared)
    return shared


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (not removed, nor made anew since)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _prune_locks(locks: Path, caches: Path) -> None:
    """The lock files of compile caches pruned (one per script ever compiled, kept forever
    otherwise): each removed under its own lock, so a run that opened it just before sees it
    gone (`_still_named`) and claims a new one."""
    if not locks.is_dir():
        return
    for path in locks.glob("*.lock"):
        if (caches / path.stem).exists():
            continue
        try:
            fd = os.open(str(path), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _still_named(fd, path):
                path.unlink()
        except OSError:
            pass  # held by a run: its cache is being made again
        finally:
            os.close(fd)


def _drop_cut_libraries(folder: str) -> None:
    """Kernel libraries cut short in the cache (a run killed while its compiler wrote a `.so`
    leaves it empty), which inductor finds and fails to load in every later run of the script
    (`ImportError: … main.so: file too short`, the compile arm a crash): removed, so they are
    compiled again. Only under the run's claim: no other run is writing them."""
    for path in Path(folder).rglob("*.so"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and not _whole_elf(path):
                path.unlink()


def _whole_elf(path: Path) -> bool:
    """An ELF file as long as its own header says: the header whole, and the section table
    (which the loader reads) within the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(64)
    if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] not in (1, 2) or header[5] not in (1, 2):
        return False
    order = "<" if header[5] == 1 else ">"
    if header[4] == 2:
        if len(header) < 64:
            return False
        offset, = struct.unpack_from(order + "Q", header, 0x28)
        entry, count = struct.unpack_from(order + "HH", header, 0x3A)
    else:
        offset, = struct.unpack_from(order + "I", header, 0x20)
        entry, count = struct.unpack_from(order + "HH", header, 0x2E)
    return offset + entry * count <= size


def release_compile_cache(compiled: str) -> None:
    """The end of a run's claim: a private cache removed, the shared one trimmed and let go."""
    if os.path.basename(os.path.dirname(compiled)).startswith(PRIVATE_PREFIX):
        remove_tree(os.path.dirname(compiled))
        return
    try:
        trim_compile_cache(compiled)
    finally:
        lock = _CLAIMS.pop(compiled, None)
        if lock is not None:
            os.close(lock)


def inductor_default_dir(env: dict[str, str], compiled: str) -> dict[str, str]:
    """Inductor keeps some of its cache (precompiled headers) in its default folder,
    /tmp/torchinductor_<user>, whatever TORCHINDUCTOR_CACHE_DIR says: inside the jail that
    folder is `default` beside the script's compile cache (its /tmp is otherwise new each run)."""
    user = env.get("LOGNAME") or env.get("USER") or env.get("LNAME") or env.get("USERNAME")
    if not user:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    inside = "/tmp/torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    return {inside: own_directory(os.path.join(os.path.dirname(compiled), "default"))}


def own_directory(path: str) -> str:
    """`path` as a directory triage made: whatever else is there (a link, a file, a socket a
    script left) is removed first.  Only for paths whose parent no arm can write, so that
    nothing can replace it between this check and the mount.  Two triage runs of one script
    may make it at once: the one that loses the race finds the other's directory and uses it."""
    for _ in range(3):
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            pass
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return path
            os.unlink(path)
        except FileNotFoundError:
            pass  # removed meanwhile (another run pruned it): make it again
    raise OSError(f"could not make the directory {path}: something else keeps taking its place")


def trim_compile_cache(compiled: str) -> None:
    """After a run: a script's compile cache past COMPILE_CACHE_SCRIPT_BYTES is emptied (a
    later run compiles again) — what a script wrote there does not outlive triage."""
    holder = os.path.dirname(compiled)
    if disk_usage([holder], COMPILE_CACHE_SCRIPT_BYTES) > COMPILE_CACHE_SCRIPT_BYTES:
        remove_tree(holder)


def warm_up_cache(python: str | None = None, directory: str | None = None) -> str:
    """The fork server's own inductor cache (the vector-ISA probe libraries its warm-up builds
    and loads), per interpreter, torch and CPU capability.  Only the parent copies it into and
    out of a zygote's private folder (`copy_plain_tree`); no arm ever sees it, so what the
    warm-up loads was built by triage's code.  Kept: building the probes takes seconds."""
    own = python in (None, sys.executable)
    key = "|".join([python or sys.executable, _torch_version() if own else "", os.uname().machine,
                    os.environ.get("ATEN_CPU_CAPABILITY", "")])
    path = cache_root(directory) / "warm-up" / hashlib.sha256(key.encode()).hexdigest()[:24]
    path.parent.mkdir(parents=True, exist_ok=True)
    return own_directory(str(path))


def copy_plain_tree(source: str, target: str, max_bytes: int = WARM_UP_CACHE_BYTES) -> None:
    """Copy the regular files and folders under `source` into `target` (made if missing), each
    file atomically; links and anything else are skipped, files already in `target` kept, and
    the copy stops past `max_bytes`.  Never raises."""
    copied = 0
    for folder, subfolders, files in os.walk(source):
        relative = os.path.relpath(folder, source)
        into = os.path.normpath(os.path.join(target, relative))
        try:
            os.makedirs(into, exist_ok=True)
        except OSError:
            continue
        subfolders[:] = [d for d in subfolders if not os.path.islink(os.path.join(folder, d))]
        for name in files:
            src, dst = os.path.join(folder, name), os.path.join(into, name)
            try:
                st = os.lstat(src)
                if not stat.S_ISREG(st.st_mode) or os.path.lexists(dst):
                    continue
                copied += st.st_size
                if copied > max_bytes:
                    return
                tmp = f"{dst}.{os.getpid()}.tmp"
                shutil.copyfile(src, tmp, follow_symlinks=False)
                os.chmod(tmp, st.st_mode & 0o755)
                os.replace(tmp, dst)
            except OSError:
                continue


def _prune(base: Path, keep: Path) -> None:
    """Caches older than the TTL, then the least recently used past the total bound."""
    cutoff = time.time() - COMPILE_CACHE_TTL_S
    kept: list[tuple[float, Path]] = []
    for entry in base.iterdir():
        try:
            st = entry.lstat()
        except OSError:
            continue
        if entry == keep:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_mtime < cutoff:
            remove_tree(str(entry))
        else:
            kept.append((st.st_mtime, entry))
    total = disk_usage([str(keep)], COMPILE_CACHE_TOTAL_BYTES)
    for _, entry in sorted(kept, reverse=True):  # newest first: the oldest are the ones past the bound
        total += disk_usage([str(entry)], COMPILE_CACHE_TOTAL_BYTES)
        if total > COMPILE_CACHE_TOTAL_BYTES:
            remove_tree(str(entry))
    _prune_locks(base.parent / "compile-locks", base)
