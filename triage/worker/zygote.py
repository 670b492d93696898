"""The fork server ("zygote") of one triage run: ``python -I -m triage.worker.zygote``.

Every process triage starts pays ``import torch`` (about a second here) and, on compile arms,
``torch._dynamo`` and inductor (two more); one triage run starts many (arms, ablations, the
minimizer's two workers, the verification of the minimal script).  This process imports
them once, in its own jail (triage/sandbox/zygote.py starts it with bubblewrap), runs no
issue code ever, and forks one child per job.  A job waits only for the imports it needs:
an eager arm is forked as soon as torch is in, a compile arm once inductor is.

What a child shares with this process, and why that keeps isolation:
- memory, copy-on-write: the imported modules as they were after import.  Nothing the
  zygote holds came from a script (it never runs one), and a child's writes stay its own, so
  a script that patches ``torch`` changes its own copy only;
- no file descriptors: before anything else the child closes every descriptor but the job's
  (standard streams, control pipe, sent with the request) — the zygote holds other pending
  jobs' pipes, which a job must not reach;
- the zygote's namespaces until it leaves them: before anything of the job's runs, the child
  enters new user, mount, PID, network, IPC and UTS namespaces, hides every directory of the
  host's temporary folders but its own scratch directory and what the job may read, mounts a
  /proc of its own PID namespace (siblings, this process and the host are not in it), drops
  every capability (bounding set included, no_new_privs set), and its PID 1 takes the whole
  namespace down when the job ends — what bubblewrap gives a spawned arm.  PID 1 is not
  dumpable (the job cannot trace it or read its memory, a copy of this process's heap), its
  working directory is "/" (not this process's scratch folder, which `/proc/1/cwd` would
  otherwise reach), and /dev is read-only for the job;
- the jail's read-only system, installation and triage package, as every arm has them.
The warm-up's probe libraries (inductor's vector-ISA checks, which a child dlopens) are built
in this process's own folder, never in the run's compile cache, which arms write.
The zygote itself is not dumpable and sees the host's /proc (a child can mount a /proc of its
own only where an unobstructed one is mounted); it runs triage's code only.

Process isolation (no bubblewrap here): the child only starts a session of its own, as a
spawned arm does.

Wire: a SOCK_SEQPACKET socket; a request is one JSON packet with the job's descriptors
attached (SCM_RIGHTS: stdout, stderr, the hold pipe where the request says "hold", then the
job's own); replies are ``{"ready": LEVEL}``, ``{"job": ID, "pid": PID}`` when
forked, ``{"job": ID, "status": CODE}`` when the child has exited (a signal death as 128 +
signal, as bubblewrap reports it), and ``{"job": ID, "error": TEXT}``.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

from triage.sandbox.confine import drop_capabilities
from triage.worker.protocol import ENTRY_POINTS, FIRST_JOB_FD, STAGE, WARM_UP_FOLDER

# Import levels, in the order they are loaded; a request names the level it needs.
LEVELS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "numpy", "triage.worker.__main__", "triage.worker.session", "triage.worker.observe",
              "triage.worker.opgraph", "triage.worker.reference", "triage.worker.rounding",
              "triage.worker.serve", "triage.worker.graphio", "triage.worker.render"),
    "compile": ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.cpp",
                "torch._inductor.fx_passes.post_grad", "torch._inductor.fx_passes.joint_graph",
                "torch._dynamo.backends.inductor", "torch._inductor.codegen.cpp_wrapper_cpu"),
}
# What inductor works out once per process on its first compile and keeps in memory: which
# vector ISAs this CPU builds and loads (six probe builds, each loaded in a child Python, about
# a second) and the hash of torch's own sources (the FX cache key's base).  Both depend only on
# the machine, the installation and the environment, which every job of the zygote shares
# (`ForkServer.accepts`), never on a script; computed here, each compiling child starts with
# them.  Nothing is loaded into this process: the ISA probes dlopen in their own children.
WARM: dict[str, tuple[tuple[str, str], ...]] = {
    "compile": (("torch._inductor.cpu_vec_isa", "valid_vec_isa_list"),
                ("torch._inductor.codecache", "torch_key")),
}
MAX_PACKET = 1 << 20
MAX_FDS = 8

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")  # read-only, as bubblewrap leaves them

_libc = ctypes.CDLL(None, use_errno=True)


def main() -> NoReturn:
    sock = socket.socket(fileno=int(os.environ.pop("TRIAGE_ZYGOTE_FD")))
    # Not dumpable: nothing of the same user reads or traces this process through /proc.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    Zygote(sock, levels=["torch", *sys.argv[1:]]).serve()


class Zygote:
    def __init__(self, sock: socket.socket, levels: list[str]) -> None:
        self.sock = sock
        self.levels = [level for level in LEVELS if level in levels]  # what this run will need
        self.loaded: list[str] = []
        self.pending: list[tuple[dict[str, Any], list[int]]] = []
        self.children: dict[int, str] = {}  # pid -> job id

    def serve(self) -> NoReturn:
        steps, loaded_all = self._steps(), False
        while True:
            self._reap()
            for request, fds in [p for p in self.pending
                                 if p[0].get("needs") in self.loaded or p[0].get("needs") not in self.levels]:
                self.pending.remove((request, fds))
                self._fork(request, fds)
            # A request first, whenever one is there; one import or probe in between, so an
            # eager job or a cancel never waits for a whole level.
            if self._readable(0.05 if loaded_all else 0):
                if not self._receive():
                    self._exit()
            elif not loaded_all:
                loaded_all = next(steps, None) is None

    def _steps(self) -> Iterator[str]:
        """Each import, then each warm-up, of every level this run needs; a level is announced
        once all of its steps are done."""
        for level in self.levels:
            for module in LEVELS[level]:
                try:
                    importlib.import_module(module)
                except Exception:  # noqa: BLE001 - a module this torch lacks: the job imports what it needs
                    pass
                yield module
            for module, function in WARM.get(level, ()):
                with _own_compile_cache():
                    try:
                        getattr(importlib.import_module(module), function)()
                    except Exception:  # noqa: BLE001 - another torch, no compiler: the job's compile works it out
                        pass
                yield function
            self.loaded.append(level)
            self._send({"ready": level})

    def _readable(self, timeout: float) -> bool:
        return bool(select.select([self.sock], [], [], timeout)[0])

    def _receive(self) -> bool:
        """One request; False when triage closed the socket (the run is over)."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_PACKET, MAX_FDS)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        request = json.loads(data)
        if "cancel" in request:
            self._cancel(str(request["cancel"]))
        else:
            self.pending.append((request, fds))
        return True

    def _cancel(self, job: str) -> None:
        for request, fds in [p for p in self.pending if p[0]["job"] == job]:
            self.pending.remove((request, fds))
            for fd in fds:
                os.close(fd)
            self._send({"job": job, "status": 128 + signal.SIGKILL})
        for pid in [pid for pid, j in self.children.items() if j == job]:
            _kill(pid)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            self._exit()

    def _fork(self, request: dict[str, Any], fds: list[int]) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, self.sock.fileno())
        for fd in fds:
            os.close(fd)
        self.children[pid] = request["job"]
        self._send({"job": request["job"], "pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.children.pop(pid, None)
            if job is not None:
                self._send({"job": job, "status": _exit_code(status)})

    def _exit(self) -> NoReturn:
        for pid in self.children:
            _kill(pid)
        os._exit(0)


@contextlib.contextmanager
def _own_compile_cache() -> Iterator[None]:
    """Inductor's cache folder while warming up: one in this process's HOME (its scratch
    folder, which no job reaches), not the run's compile cache.  Arms write the latter, so a
    probe library found there would be a script's code, loaded here, outside every arm."""
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    own = os.path.join(os.environ.get("HOME", "/nonexistent"), WARM_UP_FOLDER)
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=own, TRITON_CACHE_DIR=os.path.join(own, "triton"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _exit_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# -- the child (runs in the forked process, before and around the job) --------------------

def _child(request: dict[str, Any], fds: list[int], zygote_fd: int) -> NoReturn:
    """The forked child: confine itself, then run the job in a grandchild (PID 1 of a new
    namespace in namespace mode) and exit with its status."""
    try:
        _close_all_but(fds)
        if request.get("hold"):
            # triage moves this process into the job's cgroup first (sandbox/zygote.py).
            hold = fds.pop(2)
            if os.read(hold, 1) != b"1":
                os._exit(71)
            os.close(hold)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # Dumpable again, as a spawned process is: its own /proc files (uid_map among them)
        # belong to it.  Only the zygote and its other children see this process; the job,
        # in a PID namespace of its own, sees neither.
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        if request["namespace"]:
            _enter_namespaces()
            _mount_view(request)
        else:
            os.setsid()
        os.chdir("/")  # not the zygote's scratch folder, which /proc/1/cwd would show the job
        job = os.fork()
        if job == 0:
            if request["namespace"]:
                _init(request, fds)
            _run_job(request, fds)
        for fd in fds:
            os.close(fd)
        while True:
            pid, status = os.waitpid(job, 0)
            if pid == job:
                os._exit(_exit_code(status))
    except BaseException:  # noqa: BLE001 - the job cannot run: say why on its stderr, exit
        _report_failure(fds, request)
        os._exit(71)


def _init(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """PID 1 of the job's namespace: its own /proc, no capabilities, then the job as PID 2;
    when the job ends, so does this process and, with it, everything left in the namespace."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(_libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")
    for entry in PROC_COVERED:
        path = f"/proc/{entry}".encode()
        if os.path.exists(path):
            _check(_libc.mount(path, path, None, MS_BIND | MS_REC, None), f"bind /proc/{entry}")
            _check(_libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None),
                   f"read-only /proc/{entry}")
    drop_capabilities()
    # Not dumpable: the job (same credentials) cannot trace this process or read its memory,
    # a copy of the zygote's heap; the job itself is made dumpable again, as a spawned one is.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    job = os.fork()
    if job == 0:
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _run_job(request, fds)
    for fd in fds:
        os.close(fd)
    while True:
        pid, status = os.wait()
        if pid == job:
            os._exit(_exit_code(status))


def _close_all_but(fds: list[int]) -> None:
    """Close every descriptor this process inherited from the zygote but the job's: the
    zygote's socket and the descriptors of requests still waiting there."""
    keep = set(fds)
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd not in keep and fd > 2:
            try:
                os.close(fd)
            except OSError:  # the directory's own descriptor, closed by now
                pass


def _enter_namespaces() -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
           "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    _libc.sethostname(b"triage-arm", 10)
    _loopback_up()


def _loopback_up() -> None:
    """A new network namespace has its loopback down; bubblewrap brings it up, and so must this:
    scripts talk to themselves over 127.0.0.1 (torch.distributed's TCP rendezvous among them),
    and with it down they retry until their timeout instead of running."""
    import fcntl
    import struct

    ifreq = "16sH22s"  # struct ifreq: the name, then ifr_flags in the 24-byte union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(ifreq, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(ifreq, b"lo", 0, b"")))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(ifreq, b"lo", flags | IFF_UP, b""))


def _mount_view(request: dict[str, Any]) -> None:
    """What the job sees of the host's temporary folders: its scratch directory, the
    directories it may write, the files it may read (read-only) and nothing else.  Each is
    staged first (bound under STAGE), then every hidden root is covered (the scratch's tmp on
    /tmp, an empty read-only tmpfs on the others) and the staged entries are bound back at
    their paths.  Which roots to cover is decided before anything is mounted, and those
    outside /tmp are covered first: a temporary folder under /tmp (TMPDIR=/tmp/$USER) is gone
    from view once /tmp is covered, so it is covered with it."""
    view = request["view"]  # [[host path, path inside, writable]]
    scratch = request["scratch"]
    hidden = [root for root in request["hidden"]
              if root != "/tmp" and not root.startswith("/tmp/") and os.path.isdir(root)]
    _check(_libc.mount(b"tmpfs", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700"), "stage")
    staged = []
    for i, (host, inside, writable) in enumerate(view):
        stage = os.path.join(STAGE, str(i))
        if os.path.isdir(host):
            os.mkdir(stage)
        else:
            open(stage, "wb").close()
        _bind(host, stage, read_only=False)
        staged.append((stage, inside, writable))
    for root in hidden:
        _check(_libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"), "hide " + root)
    _bind(os.path.join(scratch, "tmp"), "/tmp", read_only=False)
    for stage, inside, writable in staged:
        if os.path.isdir(stage):
            os.makedirs(inside, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            if not os.path.exists(inside):
                open(inside, "wb").close()
        _bind(stage, inside, read_only=not writable)
    _read_only("/dev")
    _bind(os.path.join(scratch, "shm"), "/dev/shm", read_only=False)
    for root in hidden:
        _check(_libc.mount(None, root.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
               "read-only " + root)
    _check(_libc.umount2(STAGE.encode(), MNT_DETACH), "unstage")


def _read_only(path: str) -> None:
    """Remount `path` read-only, keeping the flags the zygote's jail locked on it (a user
    namespace may add MS_RDONLY, never drop nosuid/nodev/noexec)."""
    flags = os.statvfs(path).f_flag
    kept = sum(bit for bit, st in ((MS_NOSUID, os.ST_NOSUID), (MS_NODEV, os.ST_NODEV), (MS_NOEXEC, os.ST_NOEXEC))
               if flags & st)
    _check(_libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None),
           f"read-only {path}")


def _bind(source: str, target: str, read_only: bool) -> None:
    _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {target}")
    if read_only:
        _check(_libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
                           None), f"read-only {target}")


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _run_job(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """Become the job: its descriptors at 0-2 and from 3 on, nothing else open, its working
    directory, environment and argv, then the entry point's main()."""
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        stdout, stderr, *passed = fds
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for i, fd in enumerate(passed):
            os.dup2(fd, 100 + i)  # out of the way of the renumbering below
        for i in range(len(passed)):
            os.dup2(100 + i, FIRST_JOB_FD + i)
        os.closerange(FIRST_JOB_FD + len(passed), 65536)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _own_temporary_folder()
        sys.argv = [request["module"], *request["args"]]
        sys.stdin = open(0, closefd=False)
        module = importlib.import_module(ENTRY_POINTS[request["module"]])
        code = module.main()
    except BaseException:  # noqa: BLE001 - the worker's own error path reports script errors
        traceback.print_exc()
        code = 70
    from triage.worker.process import exit_now

    exit_now(code or 0)


def _own_temporary_folder() -> None:
    """The job's temporary files in its own TMPDIR. `tempfile` keeps the folder it first
    found, and inductor's codecache fixed its precompiled headers' folder under it at import:
    both were the zygote's, which the process sandbox does not let a job write (an inductor
    that loaded a cached kernel and built its header failed with PermissionError)."""
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None and hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        codecache._HEADER_DIR = os.path.join(default_cache_dir(), "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")


def _report_failure(fds: list[int], request: dict[str, Any]) -> None:
    text = f"triage's fork server could not start job {request.get('job')}:\n{traceback.format_exc()}"
    if len(fds) > 1:
        try:
            os.write(fds[1], text.encode()[-4000:])
        except OSError:
            pass


if __name__ == "__main__":
    main()
