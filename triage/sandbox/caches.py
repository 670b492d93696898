"""What outlives a run: kept where arms cannot write it, or scoped to the script that wrote it.

- collect_env's text is cached a day, but only text that triage's parent obtained from a
  jailed process running `torch.utils.collect_env` and nothing else: never what an arm
  reports (the script runs in the arm and could forge it for every later run).
- inductor's (and triton's) compile cache is one directory per script, keyed by the script's
  bytes, the interpreter, torch and the CPU capability: a later run of the *same* script
  reuses it, so a script can only poison its own later results — which it can forge anyway.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from triage.sandbox.environment import scrubbed_environment
from triage.sandbox.jail import Confinement, Isolation
from triage.sandbox.process import Limits, run_isolated

COMPILE_CACHE_TTL_S = 7 * 86400
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
    """The compile cache directory of this script (created; old ones pruned)."""
    key = "|".join([source, sys.executable, _torch_version(), os.environ.get("ATEN_CPU_CAPABILITY", "")])
    base = cache_root(directory) / "compile"
    path = base / hashlib.sha256(key.encode()).hexdigest()[:24]
    path.mkdir(parents=True, exist_ok=True)
    os.utime(path)
    _prune(base, keep=path)
    return str(path)


def inductor_default_dir(env: dict[str, str], compiled: str) -> dict[str, str]:
    """Inductor keeps some of its cache (precompiled headers) in its default folder,
    /tmp/torchinductor_<user>, whatever TORCHINDUCTOR_CACHE_DIR says: inside the jail that
    folder is the script's compile cache too (its /tmp is otherwise new each run)."""
    user = env.get("LOGNAME") or env.get("USER") or env.get("LNAME") or env.get("USERNAME")
    if not user:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    inside = "/tmp/torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    host = os.path.join(compiled, "default")
    os.makedirs(host, exist_ok=True)
    return {inside: host}


def _prune(base: Path, keep: Path) -> None:
    cutoff = time.time() - COMPILE_CACHE_TTL_S
    for entry in base.iterdir():
        try:
            if entry != keep and entry.is_dir() and not entry.is_symlink() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
