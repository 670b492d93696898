"""triage/sandbox/confine.py: each test confines a fresh `python -I` child, never pytest itself,
and has it report what it could and could not do."""
import errno
import json
import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triage.sandbox.confine import (
    ARCHES,
    BPF_JEQ_K,
    BPF_JGE_K,
    BPF_JSET_K,
    BPF_LD_W_ABS,
    BPF_RET_K,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    Held,
    _filter,
    landlock_abi,
)

ABI = landlock_abi()
MACHINE = os.uname().machine
needs_landlock = pytest.mark.skipif(ABI == 0, reason="this kernel has no Landlock")
needs_seccomp_table = pytest.mark.skipif(MACHINE not in ARCHES, reason=f"no seccomp syscall table for {MACHINE}")
# What every child may read: the interpreter, its venv and the system (merged /usr or not).
SYSTEM = [sys.prefix, sys.base_prefix, "/usr", "/bin", "/lib", "/lib64"]

PRELUDE = """
import ctypes, errno, json, os, sys
from triage.sandbox.confine import ARCHES, confine
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}

def attempt(action):
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"

def call(name, *args):
    table = ARCHES[os.uname().machine]
    nr = getattr(table, name) if name in ("clone", "clone3") else table.denied[name]
    return "ok" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]

def write(path, text="x"):
    with open(path, "w") as f:
        f.write(text)

def read(path):
    with open(path) as f:
        return f.read()
"""


def run_confined(body: str, *, before: str = "", timeout: float = 30, **options) -> dict:
    """Run `before`, confine(**options), then `body` in a fresh interpreter: the dict `out` it
    fills, and its stderr."""
    options.setdefault("writable", [])
    options["readable"] = SYSTEM + list(options.get("readable", []))
    code = "\n".join([PRELUDE, textwrap.dedent(before),
                      "out['held'] = confine(**json.loads(sys.argv[1])).as_dict()",
                      textwrap.dedent(body), "print(json.dumps(out))"])
    proc = subprocess.run([sys.executable, "-I", "-c", code, json.dumps(options)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]) | {"stderr": proc.stderr}


def require_seccomp(held: dict) -> None:
    if not held["seccomp"] and any("built without" in reason for reason in held["why_not"]):
        pytest.skip("this kernel has no seccomp")
    assert held["seccomp"], held["why_not"]


@pytest.fixture
def layout(tmp_path):
    """work/ (writable), ro/ (readable, with a file), out/ (listed nowhere, with a secret)."""
    for name in ("work", "ro", "out"):
        (tmp_path / name).mkdir()
    (tmp_path / "ro" / "data.txt").write_text("data")
    (tmp_path / "out" / "secret.txt").write_text("secret")
    return tmp_path


@needs_landlock
def test_writable_directory_takes_writes_creation_and_removal(layout):
    work = layout / "work"
    out = run_confined(f"""
        w = {str(work)!r}
        out["file"] = attempt(lambda: write(w + "/a.txt", "hello"))
        out["mkdir"] = attempt(lambda: os.makedirs(w + "/d/e"))
        out["nested"] = attempt(lambda: write(w + "/d/e/b.txt"))
        out["rename"] = attempt(lambda: os.rename(w + "/d/e/b.txt", w + "/c.txt"))
        out["symlink"] = attempt(lambda: os.symlink("a.txt", w + "/link"))
        out["fifo"] = attempt(lambda: os.mkfifo(w + "/fifo"))
        out["unlink"] = attempt(lambda: os.unlink(w + "/c.txt"))
        out["read"] = read(w + "/link")
    """, writable=[str(work), str(layout / "missing" / "dir")])  # a missing path is skipped
    assert out.pop("held")["filesystem"] and out.pop("read") == "hello" and out.pop("stderr") == ""
    assert out == dict.fromkeys(("file", "mkdir", "nested", "rename", "symlink", "fifo", "unlink"), "ok")
    assert (work / "a.txt").read_text() == "hello" and (work / "d" / "e").is_dir()


@needs_landlock
def test_nothing_is_created_outside_the_writable_directory(layout):
    out = run_confined(f"""
        out["in_readable"] = attempt(lambda: write({str(layout / "ro" / "new.txt")!r}))
        out["overwrite_readable"] = attempt(lambda: write({str(layout / "ro" / "data.txt")!r}))
        out["in_unlisted"] = attempt(lambda: write({str(layout / "out" / "new.txt")!r}))
        out["mkdir_unlisted"] = attempt(lambda: os.mkdir({str(layout / "out" / "d")!r}))
        out["remove_readable"] = attempt(lambda: os.unlink({str(layout / "ro" / "data.txt")!r}))
        out["in_tmp"] = attempt(lambda: write({str(layout / "new.txt")!r}))
    """, writable=[str(layout / "work")], readable=[str(layout / "ro")])
    del out["held"], out["stderr"]
    assert out == dict.fromkeys(out, "EACCES") and len(out) == 6
    assert not (layout / "ro" / "new.txt").exists() and not (layout / "out" / "new.txt").exists()
    assert (layout / "ro" / "data.txt").read_text() == "data"


@needs_landlock
def test_reading_is_limited_to_readable_and_writable(layout):
    single = layout / "single"
    single.mkdir()
    (single / "granted.txt").write_text("granted")
    (single / "sibling.txt").write_text("sibling")
    out = run_confined(f"""
        out["readable"] = attempt(lambda: read({str(layout / "ro" / "data.txt")!r}))
        out["list_readable"] = attempt(lambda: os.listdir({str(layout / "ro")!r}))
        out["secret"] = attempt(lambda: read({str(layout / "out" / "secret.txt")!r}))
        out["list_unlisted"] = attempt(lambda: os.listdir({str(layout / "out")!r}))
        out["single_file"] = attempt(lambda: read({str(single / "granted.txt")!r}))
        out["its_sibling"] = attempt(lambda: read({str(single / "sibling.txt")!r}))
        out["etc"] = attempt(lambda: read("/etc/passwd"))
    """, writable=[str(layout / "work")], readable=[str(layout / "ro"), str(single / "granted.txt")])
    assert (out["readable"], out["list_readable"], out["single_file"]) == ("ok", "ok", "ok")
    assert (out["secret"], out["list_unlisted"], out["its_sibling"], out["etc"]) == ("EACCES",) * 4


@needs_landlock
def test_symlinks_and_dotdot_lead_nowhere_new(layout):
    work = layout / "work"
    (work / "premade").symlink_to(layout / "out")  # made before confinement, pointing outside
    out = run_confined(f"""
        w = {str(work)!r}
        out["write_premade"] = attempt(lambda: write(w + "/premade/new.txt"))
        out["read_premade"] = attempt(lambda: read(w + "/premade/secret.txt"))
        os.symlink({str(layout / "out")!r}, w + "/fresh")
        out["write_fresh"] = attempt(lambda: write(w + "/fresh/new.txt"))
        out["dotdot_write"] = attempt(lambda: write(w + "/../out/new.txt"))
        out["dotdot_read"] = attempt(lambda: read(w + "/../out/secret.txt"))
        out["dotdot_sibling"] = attempt(lambda: write(w + "/../ro/new.txt"))
        out["hardlink"] = attempt(lambda: os.link({str(layout / "out" / "secret.txt")!r}, w + "/hard"))
    """, writable=[str(work)], readable=[str(layout / "ro")])
    del out["held"], out["stderr"]
    assert set(out.values()) <= {"EACCES", "EXDEV"} and len(out) == 7, out
    assert not (layout / "out" / "new.txt").exists() and not (layout / "ro" / "new.txt").exists()


@needs_landlock
def test_a_process_started_after_confinement_is_confined(layout):
    work, outside = layout / "work", layout / "out"
    out = run_confined(f"""
        import subprocess
        proc = subprocess.run(["/bin/sh", "-c", "echo x > {outside}/y; echo y > {work}/y; cat {outside}/secret.txt"],
                              capture_output=True, text=True)
        out["sh_out"], out["sh_err"] = proc.stdout, proc.stderr
    """, writable=[str(work)])
    assert not (outside / "y").exists() and (work / "y").read_text() == "y\n"
    assert out["sh_out"] == "" and out["sh_err"].count("Permission denied") == 2


@needs_landlock
def test_devices_can_be_used_but_nothing_created_among_them(layout):
    devices = layout / "devices"
    devices.mkdir()
    (devices / "node").write_text("")
    out = run_confined(f"""
        d = {str(devices)!r}
        out["create"] = attempt(lambda: write(d + "/new"))
        out["mkdir"] = attempt(lambda: os.mkdir(d + "/sub"))
        out["fifo"] = attempt(lambda: os.mkfifo(d + "/fifo"))
        out["remove"] = attempt(lambda: os.unlink(d + "/node"))
        out["use_existing"] = attempt(lambda: write(d + "/node"))
        out["dev_null"] = attempt(lambda: write(os.devnull))
        out["urandom"] = attempt(lambda: open("/dev/urandom", "rb").read(8))
    """, writable=[str(layout / "work")], devices=["/dev", str(devices)])
    assert (out["create"], out["mkdir"], out["fifo"], out["remove"]) == ("EACCES",) * 4
    assert (out["use_existing"], out["dev_null"], out["urandom"]) == ("ok",) * 3
    assert sorted(p.name for p in devices.iterdir()) == ["node"]


# Harmless calls to denied syscalls, each answered with something other than EPERM where
# seccomp is not in the way (a pid that cannot exist, a missing path, a bad descriptor or flag).
DENIED_CALLS = {
    "ptrace": "call('ptrace', 16, 0x3ffffff0, 0, 0)",  # PTRACE_ATTACH
    "process_vm_readv": "call('process_vm_readv', 0x3ffffff0, None, 0, None, 0, 1)",
    "mount": "call('mount', b'none', b'/nonexistent-triage/x', b'tmpfs', 0, None)",
    "umount2": "call('umount2', b'/nonexistent-triage', 0)",
    "chroot": "call('chroot', b'/nonexistent-triage')",
    "setns": "call('setns', -1, 0)",
    "unshare": "call('unshare', 1)",
    "perf_event_open": "call('perf_event_open', None, 0, -1, -1, 0)",
    "keyctl": "call('keyctl', 0, -3, 0)",  # KEYCTL_GET_KEYRING_ID of the session keyring
    "open_by_handle_at": "call('open_by_handle_at', -1, None, 0)",
    "clone3": "call('clone3', None, 0)",
    # These may answer EPERM to an unprivileged process anyway, as a sysctl says
    # (unprivileged_bpf_disabled, vm.unprivileged_userfaultfd, io_uring_disabled).
    "bpf": "call('bpf', 1000, None, 0)",
    "userfaultfd": "call('userfaultfd', 0x7fff0000)",
    "io_uring_setup": "call('io_uring_setup', 0, None)",
}
SYSCTL_DEPENDENT = {"bpf", "userfaultfd", "io_uring_setup"}


@needs_seccomp_table
def test_seccomp_denies_the_dangerous_syscalls(tmp_path):
    calls = "{" + ", ".join(f"{name!r}: {expr}" for name, expr in DENIED_CALLS.items()) + "}"
    out = run_confined(f"""
        out["after"] = {calls}
        out["unshare_user"] = call("unshare", 0x10000000)
        pid = libc.syscall(ARCHES[os.uname().machine].clone, 0x10000000 | 17, 0, 0, 0, 0)  # NEWUSER | SIGCHLD
        if pid == 0:
            os._exit(0)  # a namespaced child after all: the test fails on the answer below
        out["clone_newuser"] = "ok" if pid > 0 else errno.errorcode[ctypes.get_errno()]
        out["uid_map"] = read("/proc/self/uid_map").split()
        out["traceme"] = call("ptrace", 0, 0, 0, 0)  # last: a traced process would stop on its next signal
    """, before=f"out['before'] = {calls}; out['uid_map_before'] = read('/proc/self/uid_map').split()",
        writable=[str(tmp_path)], readable=["/proc"])
    require_seccomp(out["held"])
    expected = dict.fromkeys(DENIED_CALLS, "EPERM") | {"clone3": "ENOSYS"}
    assert out["after"] == expected
    assert all(out["before"][name] not in ("EPERM", "ENOSYS") for name in set(DENIED_CALLS) - SYSCTL_DEPENDENT), \
        out["before"]
    assert (out["unshare_user"], out["traceme"], out["clone_newuser"]) == ("EPERM",) * 3
    assert out["uid_map"] == out["uid_map_before"]  # still in the same user namespace


@needs_seccomp_table
def test_threads_fork_and_multiprocessing_still_work(tmp_path):
    out = run_confined("""
        import threading, multiprocessing
        box = []
        thread = threading.Thread(target=lambda: box.append("ran"))
        thread.start(); thread.join()
        out["thread"] = box
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        child = multiprocessing.get_context("fork").Process(target=sys.exit, args=(5,))
        child.start(); child.join()
        out["multiprocessing"] = child.exitcode
    """, writable=[str(tmp_path)])
    require_seccomp(out["held"])
    assert (out["thread"], out["fork"], out["multiprocessing"]) == (["ran"], 7, 5)


@needs_landlock
def test_threads_started_before_confinement(tmp_path):
    """Landlock before ABI 8 confines the calling thread only: confine() refuses, before it
    applies anything, rather than leave a thread of the same address space unconfined."""
    outside = tmp_path / "outside.txt"
    code = PRELUDE + textwrap.dedent(f"""
        import threading
        gate, other = threading.Event(), {{}}
        def write_outside():
            gate.wait()
            other["write"] = attempt(lambda: write({str(outside)!r}))
        thread = threading.Thread(target=write_outside)
        thread.start()
        try:
            out["held"] = confine(writable=[{str(tmp_path / "work")!r}], readable=[]).as_dict()
        except OSError as e:
            out["refused"] = [errno.errorcode[e.errno], str(e)]
            out["status"] = [line.split()[1] for line in read("/proc/self/status").splitlines()
                             if line.startswith(("NoNewPrivs:", "Seccomp:"))]
        gate.set()
        thread.join()
        out["other"] = other["write"]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if ABI >= 8:  # TSYNC: the other thread joins the domain
        assert "refused" not in out and out["other"] == "EACCES" and not outside.exists()
    else:
        assert out["refused"][0] == "EBUSY" and "2 threads" in out["refused"][1]
        assert out["status"] == ["0", "0"]  # neither no_new_privs nor a filter: nothing half-applied
        assert out["other"] == "ok"  # what that thread could have done under a half confinement


@pytest.mark.skipif(ABI < 6, reason=f"Landlock ABI {ABI}: abstract unix socket scoping needs ABI 6")
def test_abstract_unix_socket_outside_the_domain_is_unreachable(tmp_path):
    name = f"\0triage-confine-test-{os.getpid()}-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(name)
        server.listen(4)
        before = f"""
            import socket
            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect({name!r})
            out["before"] = attempt(connect)
        """
        out = run_confined("out['after'] = attempt(connect)", before=before, writable=[str(tmp_path)])
    assert out["held"]["scoped"] and (out["before"], out["after"]) == ("ok", "EPERM")


@pytest.mark.skipif(ABI < 6, reason=f"Landlock ABI {ABI}: signal scoping needs ABI 6")
def test_signals_to_processes_outside_the_domain_fail(tmp_path):
    """Signal 0 to the test process (a check, never delivered, so a failure cannot kill
    pytest) and SIGTERM to an unconfined bystander."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        out = run_confined(f"""
            import signal
            out["parent_after"] = attempt(lambda: os.kill(os.getppid(), 0))
            out["bystander"] = attempt(lambda: os.kill({bystander.pid}, signal.SIGTERM))
            pid = os.fork()
            if pid == 0:
                signal.pause()
            out["own_child"] = attempt(lambda: os.kill(pid, signal.SIGTERM))
            os.waitpid(pid, 0)
        """, before="out['parent_before'] = attempt(lambda: os.kill(os.getppid(), 0))", writable=[str(tmp_path)])
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert out["held"]["scoped"]
    assert (out["parent_before"], out["parent_after"], out["bystander"], out["own_child"]) == (
        "ok", "EPERM", "EPERM", "ok")


@pytest.mark.parametrize("deny_tcp", [True, False])
def test_tcp_bind_and_connect(tmp_path, deny_tcp):
    if deny_tcp and ABI < 4:
        pytest.skip(f"Landlock ABI {ABI}: denying TCP needs ABI 4")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        out = run_confined(f"""
            import socket
            def connect():
                with socket.create_connection(("127.0.0.1", {port}), timeout=5):
                    pass
            def bind():
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
            def udp():
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind(("127.0.0.1", 0))
            out["connect"], out["bind"], out["udp"] = attempt(connect), attempt(bind), attempt(udp)
        """, writable=[str(tmp_path)], deny_tcp=deny_tcp)
    assert out["held"]["network"] is deny_tcp
    assert (out["connect"], out["bind"]) == (("EACCES", "EACCES") if deny_tcp else ("ok", "ok"))
    # Landlock governs TCP only: with it, seccomp refuses the UDP socket (hostile-4 010).
    assert out["udp"] == ("EACCES" if deny_tcp and out["held"]["sockets"] else "ok")
    assert out["held"]["sockets"] is (deny_tcp and out["held"]["seccomp"])


@needs_landlock
@needs_seccomp_table
def test_held_names_what_held(tmp_path):
    full = run_confined("", writable=[str(tmp_path)], deny_tcp=True)["held"]
    bare = run_confined("", writable=[str(tmp_path)], seccomp=False)["held"]
    landlock = f"Landlock ABI {ABI} (filesystem"
    assert full["description"] == landlock + (", TCP denied" if ABI >= 4 else "") + (
        ", signals and abstract sockets scoped" if ABI >= 6 else "") + "), seccomp (no IP sockets)"
    assert full["seccomp"] and (ABI >= 6) == (full["why_not"] == [])
    assert not bare["seccomp"] and not bare["network"] and bare["description"].startswith(landlock)
    assert bare["why_not"][-2:] == ["TCP is not denied: not requested.", "seccomp does not hold: not requested."]
    assert "seccomp" not in bare["description"]


def test_held_without_any_mechanism():
    held = Held(landlock_abi=0, filesystem=False, network=False, scoped=False, seccomp=False,
                why_not=("Landlock does not hold: this kernel was built without it.",))
    assert held.describe() == "no kernel confinement"
    assert json.loads(json.dumps(held.as_dict()))["why_not"] == list(held.why_not)


@needs_landlock
def test_numpy_and_torch_import_with_the_installation_readable(tmp_path):
    """What a worker needs readable: the system, the interpreter and venv (in SYSTEM), and
    /proc for torch's CPU detection (cpuinfo complains, and guesses, without it)."""
    out = run_confined("""
        import numpy, torch
        out["numpy"] = float(numpy.arange(4.0).sum())
        out["torch"] = float((torch.ones(3, 3) @ torch.ones(3, 3)).sum())
    """, writable=[str(tmp_path)], readable=["/proc"], timeout=60)
    assert out["held"]["filesystem"] and (out["numpy"], out["torch"]) == (6.0, 27.0)
    assert "cpuinfo" not in out["stderr"], out["stderr"]


@needs_landlock
def test_an_accelerator_arms_own_proc_entry_is_writable_and_no_other(tmp_path):
    """CUDA's driver writes under its process's /proc entry while it starts (error 304 without,
    seen on an H200): an accelerator arm's rules make "/proc/self" writable, resolved when the
    worker confines itself, so its own entry only. Another process's entry (the parent's, the
    worker's own child's) is refused by Landlock at open (EACCES; the kernel itself would open
    it and refuse the write with EINVAL), and /proc/sys stays read-only."""
    from triage.sandbox import jail

    conf = jail.Confinement(scratch=str(tmp_path), workdir=str(tmp_path / "work"), accelerators=True)
    assert "/proc/self" in jail.confinement_rules(None, conf, namespace=False)["writable"]
    conf.accelerators = False
    rules = jail.confinement_rules(None, conf, namespace=False)
    assert not any(p.startswith("/proc") for p in rules["writable"])
    out = run_confined("""
        out["own"] = attempt(lambda: write("/proc/self/comm", "arm"))
        out["own thread"] = attempt(lambda: write("/proc/thread-self/comm", "arm"))
        out["parent"] = attempt(lambda: open(f"/proc/{os.getppid()}/comm", "w").close())
        out["sys"] = attempt(lambda: open("/proc/sys/kernel/hostname", "w").close())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, attempt(lambda: open("/proc/self/comm", "w").close()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        out["child"] = os.read(r, 64).decode()
    """, writable=[str(tmp_path), "/proc/self"], readable=["/proc"])
    assert out["held"]["filesystem"]
    assert (out["own"], out["own thread"]) == ("ok", "ok"), out
    assert (out["parent"], out["child"], out["sys"]) == ("EACCES", "EACCES", "EACCES"), out


def _header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    return {name: int(nr) for name, nr in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize("machine, header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                             ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_syscall_tables_match_the_kernel_headers(machine, header):
    if not Path(header).exists():
        pytest.skip(f"{header} is not installed here")
    kernel = _header_numbers(Path(header))
    arch = ARCHES[machine]
    ours = dict(arch.denied, clone=arch.clone, clone3=arch.clone3, seccomp=arch.seccomp)
    assert {name: kernel.get(name) for name in ours} == ours
    assert kernel["landlock_create_ruleset"] == 444 and kernel["landlock_restrict_self"] == 446


def _run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """Classic BPF, the instructions the filter uses, over one struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == BPF_RET_K:
            return k
        if op == BPF_LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
            continue
        taken = {BPF_JEQ_K: acc == k, BPF_JGE_K: acc >= k, BPF_JSET_K: bool(acc & k)}[op]
        pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_filter_program(machine):
    arch, eperm = ARCHES[machine], SECCOMP_RET_ERRNO | errno.EPERM
    program = _filter(arch)
    for name, nr in arch.denied.items():
        assert _run_bpf(program, nr, arch.audit) == eperm, name
    assert _run_bpf(program, arch.clone3, arch.audit) == SECCOMP_RET_ERRNO | errno.ENOSYS
    for flag in (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert _run_bpf(program, arch.clone, arch.audit, arg0=flag | 17) == eperm, hex(flag)
    thread_flags = 0x3D0F00  # what glibc's pthread_create passes
    assert _run_bpf(program, arch.clone, arch.audit, arg0=thread_flags) == SECCOMP_RET_ALLOW
    # The kernel reads the low word of clone's flags only, and so does the filter.
    assert _run_bpf(program, arch.clone, arch.audit, arg0=17 | (0x10000000 << 32)) == SECCOMP_RET_ALLOW
    denied = set(arch.denied.values()) | {arch.clone3}
    for nr in set(range(600)) - denied - {arch.clone}:
        assert _run_bpf(program, nr, arch.audit) == SECCOMP_RET_ALLOW, nr
    assert _run_bpf(program, 0, 0x40000003) == SECCOMP_RET_KILL_PROCESS  # i386
    assert _run_bpf(program, 0x40000000 | 0, arch.audit) == (eperm if arch.x32 else SECCOMP_RET_ALLOW)
    # With sockets refused: IPv4, IPv6 and packet sockets fail, unix ones and every other call as before.
    sockets = _filter(arch, sockets=True)
    for domain in (2, 10, 17):
        assert _run_bpf(sockets, arch.socket, arch.audit, arg0=domain) == SECCOMP_RET_ERRNO | errno.EACCES, domain
    for domain in (1, 16):  # AF_UNIX (multiprocessing), AF_NETLINK
        assert _run_bpf(sockets, arch.socket, arch.audit, arg0=domain) == SECCOMP_RET_ALLOW, domain
    for nr in set(range(600)) - denied - {arch.clone, arch.socket}:
        assert _run_bpf(sockets, nr, arch.audit) == SECCOMP_RET_ALLOW, nr
    for name, nr in arch.denied.items():
        assert _run_bpf(sockets, nr, arch.audit) == eperm, name
    assert _run_bpf(sockets, arch.clone, arch.audit, arg0=0x10000000 | 17) == eperm
