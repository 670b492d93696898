"""Confinement a process applies to itself, right before it runs a reporter's script.

`confine()` is irrevocable and inherited: nothing the script does afterwards (ctypes,
subprocesses, threads, exec) lifts it.  It complements the jail (jail.py, zygote.py) rather
than replacing it: where bubblewrap runs, the kernel enforces the same picture a second way;
where it cannot (the "process only" fallback), this is what still stands between the script
and the host.  Each mechanism, and why it is there:

- no_new_privs: without it an unprivileged process may not load a seccomp filter or enter a
  Landlock domain (a setuid program could otherwise run under rules its author never
  expected); with it, nothing exec'd can gain privileges either.
- Landlock, filesystem: the script may write only under `writable`, read and execute only
  under `readable`, and use the device nodes under `devices` without creating any.  The
  kernel checks the object a path resolves to, so symlinks and `..` lead nowhere new.
- Landlock, TCP (ABI 4, on request): no TCP bind or connect at all, for a process that has
  no business on the network even where no network namespace isolates it. With it, on the
  same request, seccomp refuses to make an IP or packet socket at all: Landlock knows TCP
  only, and a UDP datagram reaches the host's loopback and beyond as well.
- Landlock, scopes (ABI 6): no signal to a process outside the domain (triage, the fork
  server, anything else of the same user) and no connection to an abstract unix socket bound
  outside it: those have no file for the filesystem rules to deny, and belong to the network
  namespace, which the process-only fallback shares with the host's daemons.
- seccomp: the system calls that reach past those rules or attack the kernel itself —
  debugging other processes (ptrace, process_vm_*), namespaces and mounts (a user namespace
  hands the script root-like powers over its own mounts), the keyring, BPF, perf, io_uring
  (its operations bypass seccomp), userfaultfd (a kernel-race amplifier), module and kexec
  loading, and opening files by handle (which bypasses path-based checks) — fail with EPERM.
  clone3 fails with ENOSYS so that glibc falls back to clone(2), whose flags a classic BPF
  filter can read (clone3 passes them in memory it cannot); clone with a namespace flag fails.

The seccomp filter is built here, by hand, rather than with libseccomp: its Python bindings
are not on PyPI, and Debian's python3-seccomp is built for the system interpreter, not the
venv's.  The filter is about fifty classic-BPF instructions; tests/test_confine.py checks
the syscall numbers against the kernel headers where they are installed, runs the program
over every syscall number below 600, and has the kernel deny the calls.

What did not hold (a kernel without Landlock, an older ABI, a machine without a syscall
table here) is reported in `Held`, never silently assumed.  What the kernel has but fails to
apply raises OSError: the caller must not run the script then.  That includes other threads
already running where the kernel confines the calling thread only (Landlock before ABI 8):
one unconfined thread in the same address space would undo it all.  Confine before starting
threads; a child forked from the fork server has just one.
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_GET_SECCOMP = 38, 22, 21
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
# capset(2)'s number where a process can drop its capabilities here (the fork server forks
# jobs only there; elsewhere they are spawned in bubblewrap, which drops them itself).
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}

# Landlock's system calls have the same numbers on both architectures below (like every
# syscall added since the tables were unified in 5.1).
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RESTRICT_SELF_TSYNC = 1 << 3  # ABI 8

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# The rights each ABI version knows; a ruleset handles all of them, so whatever no rule grants
# is denied.
FS_BY_ABI = ((1, (1 << 13) - 1), (2, FS_REFER), (3, FS_TRUNCATE), (5, FS_IOCTL_DEV))
# The only rights the kernel accepts in a rule on something that is not a directory.
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
# Writable directories get every right except making device nodes: a root process could
# otherwise mknod a node for a disk or /dev/mem in its scratch directory, and Landlock checks
# only the node's path, never the device behind it.  EXECUTE stays: the script already runs
# arbitrary code in this interpreter (ctypes, executable mappings of anything readable,
# memfd), so refusing to exec what it wrote would stop no attack, only scripts that build and
# run a helper.  (Inductor itself needs no EXECUTE there: it runs the compiler from /usr and
# dlopens its .so files, and Landlock does not check mmap, only execve.)
WRITABLE = ~(FS_MAKE_CHAR | FS_MAKE_BLOCK)  # masked with what the ruleset handles
READABLE = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# Devices: use what exists, create or remove nothing.  TRUNCATE because `open(os.devnull, "w")`
# and a shell's `> /dev/null` open with O_TRUNC, which Landlock checks (a no-op on a device).
DEVICES = FS_READ_FILE | FS_WRITE_FILE | FS_READ_DIR | FS_TRUNCATE | FS_IOCTL_DEV
# sizeof(struct landlock_ruleset_attr) as each ABI knows it: handled_access_net came with ABI 4,
# scoped with ABI 6; a size with fields the kernel does not know is refused.
RULESET_ATTR_SIZE = ((6, 24), (4, 16), (1, 8))

SECCOMP_SET_MODE_FILTER, SECCOMP_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 2, 1
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].  Both
# architectures below are little-endian (big-endian arm64 reports itself as aarch64_be), so
# the low word of args[0] comes first.
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARG0_LOW = 0, 4, 16
X32_SYSCALL_BIT = 0x40000000
# clone(2) flags that create namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET); all in the low word of the flags.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# socket(2) domains that reach a network: IPv4, IPv6, raw packets (AF_INET, AF_INET6, AF_PACKET).
NETWORK_DOMAINS = (2, 10, 17)


@dataclass(frozen=True)
class _Arch:
    audit: int  # AUDIT_ARCH_*, what seccomp_data.arch holds for this ABI
    seccomp: int
    clone: int
    clone3: int
    socket: int
    x32: bool  # a second syscall ABI (x32) shares the audit arch, told apart by X32_SYSCALL_BIT
    denied: Mapping[str, int]


# From the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl; the generic
# include/uapi/asm-generic/unistd.h for arm64, which has no iopl/ioperm).
ARCHES = {
    "x86_64": _Arch(0xC000003E, seccomp=317, clone=56, clone3=435, socket=41, x32=True, denied={
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
        "request_key": 249, "perf_event_open": 298, "userfaultfd": 323, "bpf": 321, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
        "quotactl": 179, "iopl": 172, "ioperm": 173, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "lookup_dcookie": 212}),
    "aarch64": _Arch(0xC00000B7, seccomp=277, clone=220, clone3=435, socket=198, x32=False, denied={
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
        "request_key": 218, "perf_event_open": 241, "userfaultfd": 282, "bpf": 280, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89,
        "quotactl": 60, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "lookup_dcookie": 18}),
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@dataclass(frozen=True)
class Held:
    """What the kernel enforces on this process after `confine()`, for the report."""

    landlock_abi: int  # 0 where Landlock is unavailable
    filesystem: bool  # Landlock filesystem rules applied
    network: bool  # Landlock denies every TCP bind and connect
    scoped: bool  # Landlock scopes: signals and abstract unix sockets stay inside the domain
    seccomp: bool  # the seccomp deny list is loaded
    why_not: tuple[str, ...]  # one sentence per mechanism that did not hold, and why
    sockets: bool = False  # seccomp refuses IP and packet sockets (UDP included)

    def describe(self) -> str:
        parts = []
        if self.filesystem:
            scope = ["filesystem"]
            if self.network:
                scope.append("TCP denied")
            if self.scoped:
                scope.append("signals and abstract sockets scoped")
            parts.append(f"Landlock ABI {self.landlock_abi} ({', '.join(scope)})")
        if self.seccomp:
            parts.append("seccomp (no IP sockets)" if self.sockets else "seccomp")
        return ", ".join(parts) or "no kernel confinement"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "why_not": list(self.why_not), "description": self.describe()}


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers this process; 0 if unsupported or disabled."""
    return _landlock_probe()[0]


def confine(*, writable: Sequence[str], readable: Sequence[str], devices: Sequence[str] = ("/dev",),
            deny_tcp: bool = False, seccomp: bool = True) -> Held:
    """Confine this process and every process or thread it starts from now on, for good.

    `readable` must hold what the worker loads after this call: for Python and torch, the
    system (/usr and the root's /bin, /lib* links, which are followed), the interpreter's
    installation and the venv, /proc (torch's cpuinfo reads /proc/cpuinfo, and guesses
    without it), and the /etc files libc reads, as files, not all of /etc (jail.ETC_ALLOWED:
    without /etc/passwd, getpass.getuser(), which names inductor's cache directory, fails
    where USER is not set).  Paths that do not exist, or cannot be opened, are skipped: a
    rule names what the path resolves to now, and a skipped one grants nothing.  Raises
    OSError where a mechanism this kernel has fails to apply, or where other threads run that
    it could not confine (see the module docstring).
    """
    held, arch = _plan(deny_tcp, seccomp)
    if held.landlock_abi and held.landlock_abi < 8:
        _require_single_thread("Landlock before ABI 8 restricts the calling thread only")
    if _capabilities() and os.uname().machine in SYS_CAPSET:
        # Root outside a jail (the process sandbox): CAP_SYS_PTRACE would let it read other
        # processes' memory and environment through /proc past Landlock's ptrace rule.
        drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    if held.filesystem:
        _landlock(held.landlock_abi, writable, readable, devices, held.network, held.scoped)
    if held.seccomp and arch is not None:
        _seccomp(arch, held.sockets)
    return held


def available(*, deny_tcp: bool = False, seccomp: bool = True) -> Held:
    """What `confine` would enforce in this process, without applying anything: for the
    report, which names the mechanisms that held."""
    return _plan(deny_tcp, seccomp)[0]


def _plan(deny_tcp: bool, seccomp: bool) -> tuple[Held, _Arch | None]:
    why_not: list[str] = []
    abi, missing = _landlock_probe()
    network, scoped = deny_tcp and abi >= 4, abi >= 6
    if abi:
        if not scoped:
            why_not.append(f"Signals and abstract unix sockets are not scoped: that needs Landlock ABI 6, "
                           f"this kernel has {abi}.")
    else:
        why_not.append(f"Landlock does not hold: {missing}.")
    if not deny_tcp:
        why_not.append("TCP is not denied: not requested.")
    elif not network:
        why_not.append(f"TCP is not denied: that needs Landlock ABI 4, this kernel has {abi or 'none'}.")

    arch = ARCHES.get(os.uname().machine) if ctypes.sizeof(ctypes.c_void_p) == 8 else None
    filtered = False
    if not seccomp:
        why_not.append("seccomp does not hold: not requested.")
    elif arch is None:
        why_not.append(f"seccomp does not hold: no syscall table here for {os.uname().machine} "
                       f"({8 * ctypes.sizeof(ctypes.c_void_p)}-bit process).")
    elif _libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        why_not.append("seccomp does not hold: this kernel was built without it.")
    else:
        filtered = True
    return Held(landlock_abi=abi, filesystem=bool(abi), network=network, scoped=scoped, seccomp=filtered,
                why_not=tuple(why_not), sockets=filtered and deny_tcp), arch


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """What bubblewrap does for its sandboxed process: no capability in any set, none to be
    regained by exec (bounding set emptied, no_new_privs)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the bounding set")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.syscall(SYS_CAPSET[os.uname().machine], ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    if any(int(status[key], 16) for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb") if key in status):
        raise OSError("capabilities were not dropped")


def _capabilities() -> int:
    """This process's effective capabilities (0 in any jail: bubblewrap and the fork server drop them)."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)


def _landlock_probe() -> tuple[int, str]:
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if version >= 0:
        return version, ""
    code = ctypes.get_errno()
    reason = {errno.ENOSYS: "this kernel was built without it",
              errno.EOPNOTSUPP: "it is built in but disabled (not in the kernel's lsm= list)"}
    return 0, reason.get(code, f"probing it failed: {os.strerror(code)}")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the UAPI: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock(abi: int, writable: Sequence[str], readable: Sequence[str], devices: Sequence[str],
              network: bool, scoped: bool) -> None:
    handled = 0
    for since, rights in FS_BY_ABI:
        handled |= rights if abi >= since else 0
    # No network rule follows: with both rights handled, every TCP bind and connect is denied.
    attr = _RulesetAttr(handled, (NET_BIND_TCP | NET_CONNECT_TCP) if network else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if scoped else 0)
    size = next(size for since, size in RULESET_ATTR_SIZE if abi >= since)
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                            ctypes.c_uint32(0))
    _check(ruleset, "landlock_create_ruleset")
    try:
        for paths, rights in ((writable, WRITABLE), (readable, READABLE), (devices, DEVICES)):
            for path in paths:
                _allow(ruleset, path, rights & handled)
        flags = LANDLOCK_RESTRICT_SELF_TSYNC if abi >= 8 else 0
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        # Decided on the object the rule will name (fstat of the same descriptor), so a path
        # swapped between a check and the open cannot get directory rights on a file.
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FS_FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                             ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _filter(arch: _Arch, sockets: bool = False) -> bytes:
    """The classic-BPF program: jumps name one of the returns at its end, resolved to offsets.
    `sockets`: socket(2) in a NETWORK_DOMAINS domain fails with EACCES (as Landlock's TCP
    denial does)."""
    returns = {"allow": SECCOMP_RET_ALLOW, "eperm": SECCOMP_RET_ERRNO | errno.EPERM,
               "enosys": SECCOMP_RET_ERRNO | errno.ENOSYS, "eacces": SECCOMP_RET_ERRNO | errno.EACCES}
    body: list[tuple[int, int | str, int | str, int]] = [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_ARCH),
        (BPF_JEQ_K, 1, 0, arch.audit),
        # Another ABI of this CPU (i386 through int 0x80 on x86_64) has other numbers altogether.
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_NR),
    ]
    if arch.x32:
        body.append((BPF_JGE_K, "eperm", 0, X32_SYSCALL_BIT))
    body += [(BPF_JEQ_K, "eperm", 0, nr) for nr in sorted(arch.denied.values())]
    if sockets:  # socket(domain, …): past the domain checks when it is another call
        body += [(BPF_JEQ_K, 0, 1 + len(NETWORK_DOMAINS), arch.socket),
                 (BPF_LD_W_ABS, 0, 0, SECCOMP_ARG0_LOW)]
        body += [(BPF_JEQ_K, "eacces", 0, domain) for domain in NETWORK_DOMAINS[:-1]]
        body += [(BPF_JEQ_K, "eacces", "allow", NETWORK_DOMAINS[-1])]
    body += [(BPF_JEQ_K, "enosys", 0, arch.clone3),
             (BPF_JEQ_K, 0, "allow", arch.clone),
             (BPF_LD_W_ABS, 0, 0, SECCOMP_ARG0_LOW),
             (BPF_JSET_K, "eperm", 0, CLONE_NAMESPACES)]  # falls through to "allow"
    target = {label: len(body) + i for i, label in enumerate(returns)}

    def offset(at: int, jump: int | str) -> int:
        return target[jump] - at - 1 if isinstance(jump, str) else jump

    program = [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(body)]
    program += [(BPF_RET_K, 0, 0, value) for value in returns.values()]
    # struct sock_filter {__u16 code; __u8 jt; __u8 jf; __u32 k;}: struct.pack refuses a jump
    # that does not fit a byte, where ctypes would silently truncate it.
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _seccomp(arch: _Arch, sockets: bool) -> None:
    code = _filter(arch, sockets)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # TSYNC: every thread of the process gets the filter, not the calling one only.
    result = _libc.syscall(arch.seccomp, ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                           ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if result > 0:
        raise OSError(errno.EBUSY, f"seccomp: thread {result} could not be synchronized")
    if result < 0 and ctypes.get_errno() == errno.ENOSYS:
        # seccomp(2) is younger than filters (3.17 against 3.5), and some outer sandboxes
        # refuse it; prctl loads the filter for this thread only.
        _require_single_thread("PR_SET_SECCOMP filters the calling thread only")
        result = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0)
    _check(result, "seccomp filter")


def _require_single_thread(why: str) -> None:
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise OSError(errno.EBUSY, f"{threads} threads run in this process and {why}: confine before starting any")


def _check(result: int, what: str) -> None:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
