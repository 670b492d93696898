import sys

import pytest

from triage.sandbox import Confinement, Limits, isolation, run_isolated, scrubbed_environment

ISOLATIONS = ["namespace", "process"]


def _run(tmp_path, code, how="auto", **limits):
    args = dict(timeout_s=20, memory_bytes=2 << 30, output_bytes=64 * 1024)
    args.update(limits)
    return run_isolated([sys.executable, "-c", code], jail=Confinement(str(tmp_path), str(tmp_path / "work")),
                        env=scrubbed_environment(), limits=Limits(**args), isolation=isolation(how))


def test_environment_is_scrubbed_of_secrets():
    env = scrubbed_environment({"PATH": "/bin", "GITHUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
                                "TORCH_API_KEY": "k", "CUDA_VISIBLE_DEVICES": "0", "RANDOM_VAR": "x",
                                "ATEN_CPU_CAPABILITY": "default"})
    assert env["PATH"] == "/bin" and env["CUDA_VISIBLE_DEVICES"] == "0" and env["ATEN_CPU_CAPABILITY"] == "default"
    assert not {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "TORCH_API_KEY", "RANDOM_VAR"} & set(env)


@pytest.mark.parametrize("how", ISOLATIONS)
def test_timeout_kills_the_process_group(tmp_path, how):
    out = _run(tmp_path, "import subprocess,time; subprocess.Popen(['sleep','60']); time.sleep(60)", how, timeout_s=1)
    assert out.timed_out and out.elapsed_s < 10


@pytest.mark.parametrize("how", ISOLATIONS)
def test_a_timed_out_tree_that_sleeps_is_idle_and_one_that_computes_is_not(tmp_path, how):
    """A deadlocked script (here: a forked child and its parent, both asleep) uses no CPU
    while it waits: the outcome says for how long, which a busy loop never is."""
    # Its start (the jail, Python's own imports) computes for a fraction of a second, more on
    # a loaded machine (a whole suite on two cores: the 4 s run it had was idle for 0 s once):
    # half of its time asleep is what an idle tree shows there too.
    asleep = _run(tmp_path, "import os,time\nif os.fork() == 0: time.sleep(60)\nelse: os.wait()", how, timeout_s=6)
    busy = _run(tmp_path, "while True: pass", how, timeout_s=3)
    assert asleep.timed_out and busy.timed_out
    assert asleep.idle_s >= asleep.elapsed_s / 2, (asleep.idle_s, asleep.elapsed_s)
    assert busy.idle_s < 1.5, busy.idle_s


def test_idle_tail_ends_at_the_last_interval_that_computed():
    from triage.sandbox.process import idle_tail

    # Busy for 5 s, then a pool's handler threads: a millisecond a second.
    samples = [(t, min(t, 5.0) + 0.001 * max(0, t - 5)) for t in range(0, 31)]
    assert idle_tail(samples) == 25
    assert idle_tail([(t, float(t)) for t in range(10)]) == 0  # a core all the time
    assert idle_tail([(0, 0.0), (1, 0.0)]) == 1


def test_output_is_capped_head_and_tail(tmp_path):
    out = _run(tmp_path, "import sys\nfor i in range(200000): sys.stdout.write(f'line {i}\\n')\nprint('END')")
    assert out.exit_code == 0 and "line 0\n" in out.stdout and "END" in out.stdout
    assert out.output_dropped > 1_000_000 and len(out.stdout) < 80 * 1024


@pytest.mark.parametrize("how", ISOLATIONS)
def test_segfault_is_reported_as_a_signal(tmp_path, how):
    out = _run(tmp_path, "import ctypes; ctypes.string_at(0)", how)
    assert out.signal == "SIGSEGV"


@pytest.mark.parametrize("how", ISOLATIONS)
def test_memory_ceiling(tmp_path, how):
    out = _run(tmp_path, "x = []\nwhile True: x.append(bytearray(50 << 20))", how, memory_bytes=300 << 20)
    assert out.memory_exceeded


def test_a_phase_extends_the_deadline_once(tmp_path):
    code = ("import os,json,time; fd=int(os.environ['TRIAGE_CONTROL_FD']); "
            "time.sleep(0.5); os.write(fd, (json.dumps({'phase':'script-done'})+'\\n').encode()); time.sleep(1.5)")
    out = _run(tmp_path, code, timeout_s=1, phases=(("script-done", 5),))
    assert not out.timed_out and out.exit_code == 0 and out.messages == [{"phase": "script-done"}]


def test_post_refuses_the_process_sandbox_unless_allowed(tmp_path):
    """Where arms would run in the process sandbox, the repro could read the token from
    triage's process: `issue --post` refuses before anything runs."""
    from click.testing import CliRunner

    from triage.cli import main

    result = CliRunner().invoke(main, ["issue", "octo/demo#1", "--post", "--isolation", "process",
                                       "--out", str(tmp_path / "out")], env={"GITHUB_TOKEN": "t"})
    assert result.exit_code == 2 and "refusing to --post" in result.output, result.output


def test_namespace_sandbox_asked_for_where_there_is_none(tmp_path):
    """Without bubblewrap on PATH: `--isolation namespace` is a usage error naming why."""
    import subprocess

    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    done = subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--isolation", "namespace",
                           "--comment", "-", "--minimal", "-"], capture_output=True, text=True,
                          env={"PATH": str(tmp_path), "HOME": str(tmp_path)}, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "bubblewrap (bwrap) is not installed" in done.stderr, done.stderr


def test_secrets_leave_triages_own_environment():
    """At start every secret-looking variable leaves os.environ and the block that
    /proc/<pid>/environ shows (another process could read it there); the token the posting
    step needs is returned, to be kept in memory only."""
    import subprocess

    code = ("import os\nfrom triage.sandbox import scrub_own_secrets\n"
            "kept = scrub_own_secrets(keep=('GITHUB_TOKEN',))\n"
            "block = open('/proc/self/environ', 'rb').read()\n"
            "print(kept, b'ghp_keep' in block, b'aws_drop' in block, 'AWS_SECRET_ACCESS_KEY' in os.environ, "
            "b'PLAIN=1' in block)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"GITHUB_TOKEN": "ghp_keep", "AWS_SECRET_ACCESS_KEY": "aws_drop", "PLAIN": "1"})
    assert done.stdout.strip() == "{'GITHUB_TOKEN': 'ghp_keep'} False False False True"


@pytest.mark.slow
def test_minimal_repro_with_an_inputs_file_is_written_and_verified_in_the_sandbox(tmp_path):
    """The warm worker writes the inputs file where its sandbox lets it; the parent moves it
    beside minimal.py, and the fresh verification arms may read that one file."""
    from tests.conftest import run_triage

    script = tmp_path / "big.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nx = torch.randn(64, 64)\ny = (x @ x).relu()\n"
                      "print(y.sum())\n")
    code, report, comment, out = run_triage(script, "cpu,cpu/fault=mm", tmp_path, "--minimal",
                                            str(tmp_path / "minimal.py"), "--no-ablate", "--keep-data")
    assert code == 0, out
    m = report["minimal"]
    assert m["ops"] == ["aten.mm"] and m["inputs_file"] == "minimal_inputs.pt" and m["verified"], m
    assert (tmp_path / "minimal_inputs.pt").is_file() and report["isolation"]["kind"] == "namespace"
