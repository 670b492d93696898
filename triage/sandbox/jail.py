"""The namespace sandbox: every process that runs issue code is started inside bubblewrap.

What the jail gives the reporter's code, and why each line is there:

- new user, PID, network, IPC, UTS and cgroup namespaces: no other process is visible or
  signalable, no network (only its own loopback), and when the sandbox's PID 1 dies the
  kernel kills every process in it: nothing the script starts (setsid, double fork) outlives
  the arm (`--die-with-parent` ties PID 1 to triage);
- a fresh `/proc` of that PID namespace only: the host's processes, their environments and
  memory (triage's token among them) are not there to read;
- read-only: the system (`/usr` and the root symlinks), an allow-list of `/etc` files (never
  `/etc/shadow` or credentials), `/sys`, the Python installation and site-packages, and
  triage's own package — the script can neither tamper with triage nor with later runs;
- writable: one scratch directory per process (its working directory, `/tmp`, `/dev/shm`
  and an empty HOME all live there, on disk, where the parent measures them), plus the
  directories the caller shares on purpose (the compile cache of this same script);
- `/dev` holds the device nodes only, read-only: no file can be kept there (it would be
  memory no limit counts);
- the root itself is remounted read-only, so nothing can be created anywhere else;
- every host path given to bubblewrap is checked first (`host_directory`, `host_path`): a
  writable one must be a real directory, not a link a script left in a folder it could
  write, and links above it are resolved before bubblewrap sees the path.

Inside, the worker confines itself further before any issue code runs (sandbox/confine.py:
Landlock, seccomp), and the parent holds its memory and tasks in a cgroup where it can
(sandbox/cgroups.py).

Where bubblewrap is missing or user namespaces are refused (`kernel.unprivileged_userns_clone`,
AppArmor's `apparmor_restrict_unprivileged_userns`), `isolation()` says so and the caller
falls back to the process sandbox, which the report then names as "process only".
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

NAMESPACE = "namespace"
PROCESS = "process"

# /etc entries programs need to start (dynamic loader, users, time zone, alternatives for the
# compilers inductor runs, OS release for collect_env); nothing with credentials in it.
ETC_ALLOWED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
               "localtime", "timezone", "hosts", "host.conf", "os-release", "lsb-release", "debian_version",
               "mime.types", "gai.conf")
ROOT_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
# Device nodes every process may open (bubblewrap's --dev makes these).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts",
           "/dev/ptmx")
# Device nodes an accelerator arm needs (NVIDIA, then ROCm); absent ones are skipped.
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                       "/dev/nvidia-caps", "/dev/kfd", "/dev/dri")


@dataclass(frozen=True)
class Isolation:
    """How arms are isolated on this machine, for the report and for `--post`'s refusal."""

    kind: str  # NAMESPACE or PROCESS
    detail: str  # what enforces it, or why the namespace sandbox could not be had

    @property
    def strong(self) -> bool:
        return self.kind == NAMESPACE


@dataclass
class Confinement:
    """One jailed process: its scratch directory and what else it may see."""

    scratch: str  # writable; the working directory, HOME, /tmp and /dev/shm are inside it
    workdir: str  # inside scratch
    writable: list[str] = field(default_factory=list)
    readable: list[str] = field(default_factory=list)  # files or directories, read-only
    # writable host directories shown at another path (jail only): path inside -> host path
    mounts: dict[str, str] = field(default_factory=dict)
    accelerators: bool = False
    # The fork server only (sandbox/zygote.py): empty directories made in the jail's root, and
    # the host's /proc instead of a new one (a forked child mounts the /proc of its own PID
    # namespace, which the kernel allows only where an unobstructed /proc is already mounted:
    # bubblewrap's own covers parts of it). The zygote runs no issue code.
    directories: list[str] = field(default_factory=list)
    host_proc: bool = False

    def prepare(self) -> dict[str, str]:
        """Create the scratch layout; returns the environment entries that point into it."""
        for sub in ("home", "tmp", "shm"):
            os.makedirs(os.path.join(self.scratch, sub), exist_ok=True)
        os.makedirs(self.workdir, exist_ok=True)
        return {"HOME": os.path.join(self.scratch, "home"), "TMPDIR": "/tmp"}


def bubblewrap() -> str | None:
    return shutil.which("bwrap")


def command(argv: list[str], jail: Confinement, info_fd: int) -> list[str]:
    """The bubblewrap command line that runs `argv` confined to `jail`."""
    bwrap = bubblewrap()
    if bwrap is None:
        raise RuntimeError("bubblewrap is not installed")
    args = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "triage-arm"]
    for entry in ROOT_ENTRIES:
        path = "/" + entry
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_ALLOWED:
        args += ["--ro-bind-try", "/etc/" + name, "/etc/" + name]
    args += ["--ro-bind-try", "/sys", "/sys"]
    args += ["--bind", "/proc", "/proc"] if jail.host_proc else ["--proc", "/proc"]
    args += ["--dev", "/dev"]
    for path in jail.directories:
        args += ["--dir", path]
    if jail.accelerators:
        for device in list(ACCELERATOR_DEVICES) + sorted(glob.glob("/dev/nvidia[0-9]*")):
            args += ["--dev-bind-try", device, device]
    # /tmp first: the scratch directory and the shared ones usually live under the host's
    # /tmp, and a later mount on /tmp would hide them.
    args += ["--remount-ro", "/dev",
             "--bind", host_directory(os.path.join(jail.scratch, "tmp")), "/tmp",
             "--bind", host_directory(os.path.join(jail.scratch, "shm")), "/dev/shm"]
    for path in interpreter_paths(argv[0] if argv and argv[0] != sys.executable else None):
        args += ["--ro-bind", path, path]
    for path in jail.readable:
        args += ["--ro-bind", host_path(path), path]
    args += ["--bind", host_directory(jail.scratch), jail.scratch]
    for path in jail.writable:
        args += ["--bind", host_directory(path), path]
    for inside, host in jail.mounts.items():
        args += ["--bind", host_directory(host), inside]
    args += ["--remount-ro", "/", "--chdir", jail.workdir, "--info-fd", str(info_fd), "--", *argv]
    return args


def confinement_rules(python: str | None, jail: Confinement, namespace: bool) -> dict[str, Any]:
    """What the worker lets itself reach once it confines itself (sandbox/confine.py), before
    any issue code runs: paths as the process sees them.  Writable: its scratch directory and
    what the caller shares (in the jail, also where those are shown: /tmp, /dev/shm, the
    mounts).  Readable: the system, the installation, the files it was given.  Without a
    network namespace (process isolation) TCP is denied outright."""
    writable = [jail.scratch, *jail.writable, "/dev/shm"]  # /dev/shm: POSIX semaphores (multiprocessing)
    writable += ["/tmp", *jail.mounts] if namespace else list(jail.mounts.values())
    readable = ["/" + entry for entry in ROOT_ENTRIES] + ["/etc/" + name for name in ETC_ALLOWED]
    readable += ["/sys", "/proc", *interpreter_paths(python if python != sys.executable else None), *jail.readable]
    # The nodes a program opens, by name: outside the jail /dev also holds the host's disks.
    devices = [*DEVICES, *(ACCELERATOR_DEVICES if jail.accelerators else ())]
    if jail.accelerators:
        devices += sorted(glob.glob("/dev/nvidia[0-9]*"))
        # CUDA's driver writes under its own process's /proc entry while it starts: without
        # this, cudaGetDeviceCount fails with error 304 (measured on an H200, torch 2.11).
        # "/proc/self" resolves in the worker when it confines itself: its own entry only,
        # never another process's nor /proc/sys.
        writable.append("/proc/self")
    return {"writable": writable, "readable": readable, "devices": devices, "deny_tcp": not namespace}


def host_directory(path: str) -> str:
    """`path` as bubblewrap or mount(2) may take it for a writable mount: links above it
    resolved, and the directory itself a real one — never a link, which the mount would
    follow to wherever a script pointed it.  Raises OSError otherwise."""
    resolved = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    st = os.lstat(resolved)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"refusing to mount {path}: not a directory (a link or file was left there)")
    return resolved


def host_path(path: str) -> str:
    """A read-only file or directory for the jail: fully resolved, so the mount reads what
    triage checked."""
    resolved = os.path.realpath(path)
    os.lstat(resolved)
    return resolved


@functools.cache
def interpreter_paths(python: str | None = None) -> tuple[str, ...]:
    """What `python -I -m triage.worker` reads: the installation, site-packages, whatever the
    .pth files add (an editable install's finder points at the checkout's `triage/` only; a
    torch environment's adds its copy of triage), and triage's own package — each once,
    outside the system directories already bound.  `python`: the interpreter the jail runs
    (another torch release's environment, sandbox/torch_envs.py); None: triage's own."""
    import triage

    probe = subprocess.run([python or sys.executable, "-I", "-c",
                            "import sys; print('\\n'.join([sys.prefix, sys.base_prefix, sys.exec_prefix, "
                            "sys.base_exec_prefix, *sys.path]))"],
                           capture_output=True, text=True, timeout=60, check=False)
    candidates = [p for p in probe.stdout.splitlines() if p]
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        candidates += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                       os.path.dirname(os.path.abspath(triage.__file__))]
    elif probe.returncode != 0 or not candidates:
        raise OSError(f"{python} could not start: {(probe.stderr.strip().splitlines() or ['no output'])[-1][:200]}")
    covered = ["/" + e for e in ROOT_ENTRIES]
    chosen: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates} | {os.path.abspath(p) for p in candidates},
                       key=len):
        if not os.path.exists(path) or any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered + chosen):
            continue
        chosen.append(path)
    return tuple(chosen)


@functools.cache
def isolation(requested: str = "auto") -> Isolation:
    """What this machine allows: the namespace sandbox when bubblewrap runs a Python in it,
    else the process sandbox, with the reason.  `requested` is auto, namespace or process."""
    if requested == PROCESS:
        return Isolation(PROCESS, "process only (asked for with --isolation process): the script runs as this user "
                                  "with a scrubbed environment and its own process group; "
                                  + kernel_mechanisms(namespace=False))
    reason = _namespace_unavailable()
    if reason is None:
        return Isolation(NAMESPACE, "bubblewrap: user, PID, network, IPC and mount namespaces; the installation "
                                    "read-only; only a scratch directory writable; an empty HOME; "
                                    + kernel_mechanisms(namespace=True))
    return Isolation(PROCESS, f"process only: {reason}; the script runs as this user with a scrubbed environment "
                              "and its own process group; " + kernel_mechanisms(namespace=False))


def kernel_mechanisms(namespace: bool) -> str:
    """What the kernel enforces in every job on this machine, beside the namespaces: the
    worker's own confinement (sandbox/confine.py) and the cgroup (sandbox/cgroups.py) — and,
    for each that is missing, what that leaves open."""
    from triage.sandbox import cgroups, confine

    held = confine.available(deny_tcp=not namespace)
    parts = [f"in every job: {held.describe()}"]
    if not held.filesystem:
        parts.append("without Landlock " + ("the mounts alone bound what it reads and writes" if namespace
                                            else "it can read what this user can read and write where this user can"))
    if not namespace and not held.network:
        parts.append("it can reach the network")
    elif not namespace and not held.sockets:
        parts.append("UDP reaches the network (TCP only is denied)")
    if not namespace:
        # No mount namespace: these are the host's. POSIX semaphores (multiprocessing, a
        # DataLoader's workers) need /dev/shm writable, and Landlock does not check connect()
        # to a unix socket by its path.
        parts.append("the host's /dev/shm is shared (readable and writable) and a daemon's unix socket "
                     "(ssh-agent, Docker, a local Ray) is reachable where this user's permissions allow")
    if not held.seccomp:
        parts.append("no seccomp filter: only the dropped capabilities stand between it and ptrace, "
                     "namespaces and the keyring" if namespace else "no seccomp filter")
    support = cgroups.support()
    if support.kind != "none":
        parts.append(support.summary())
    if not support.memory:
        parts.append("memory polled, not held by a cgroup: memory in no process's pages (an unmapped memfd, "
                     "System V shared memory) is not counted")
    if not support.tasks:
        parts.append("tasks (threads included) polled, not held by a cgroup")
    return "; ".join(parts)


def _namespace_unavailable() -> str | None:
    if bubblewrap() is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu package `bubblewrap`)"
    import tempfile

    scratch = tempfile.mkdtemp(prefix="triage-probe-")
    try:
        jail = Confinement(scratch=scratch, workdir=os.path.join(scratch, "work"))
        env = dict(jail.prepare(), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        read_fd, write_fd = os.pipe()
        try:
            done = subprocess.run(command([sys.executable, "-I", "-c", "import triage"], jail, write_fd),
                                  env=env, capture_output=True, text=True, timeout=60, pass_fds=(write_fd,),
                                  check=False)
        finally:
            os.close(read_fd)
            os.close(write_fd)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start ({e})"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
        return f"bubblewrap could not create the sandbox ({why}; user namespaces may be disabled: " \
               "sysctl kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0)"
    return None
