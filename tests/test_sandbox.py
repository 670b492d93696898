import sys

from triage.sandbox import Limits, run_isolated, scrubbed_environment


def _run(tmp_path, code, **limits):
    args = dict(timeout_s=20, memory_bytes=2 << 30, output_bytes=64 * 1024)
    args.update(limits)
    return run_isolated([sys.executable, "-c", code], cwd=str(tmp_path), env=scrubbed_environment(),
                        limits=Limits(**args))


def test_environment_is_scrubbed_of_secrets():
    env = scrubbed_environment({"PATH": "/bin", "GITHUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
                                "TORCH_API_KEY": "k", "CUDA_VISIBLE_DEVICES": "0", "RANDOM_VAR": "x",
                                "ATEN_CPU_CAPABILITY": "default"})
    assert env["PATH"] == "/bin" and env["CUDA_VISIBLE_DEVICES"] == "0" and env["ATEN_CPU_CAPABILITY"] == "default"
    assert not {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "TORCH_API_KEY", "RANDOM_VAR"} & set(env)
    # A capability of its own gets an inductor cache of its own; a cache the user chose is kept.
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("_default")
    chosen = scrubbed_environment({"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/c"})
    assert chosen["TORCHINDUCTOR_CACHE_DIR"] == "/c"


def test_timeout_kills_the_process_group(tmp_path):
    out = _run(tmp_path, "import subprocess,time; subprocess.Popen(['sleep','60']); time.sleep(60)", timeout_s=1)
    assert out.timed_out and out.elapsed_s < 10


def test_output_is_capped_head_and_tail(tmp_path):
    out = _run(tmp_path, "import sys\nfor i in range(200000): sys.stdout.write(f'line {i}\\n')\nprint('END')")
    assert out.exit_code == 0 and "line 0\n" in out.stdout and "END" in out.stdout
    assert out.output_dropped > 1_000_000 and len(out.stdout) < 80 * 1024


def test_segfault_is_reported_as_a_signal(tmp_path):
    out = _run(tmp_path, "import ctypes; ctypes.string_at(0)")
    assert out.signal == "SIGSEGV"


def test_memory_ceiling(tmp_path):
    out = _run(tmp_path, "x = []\nwhile True: x.append(bytearray(50 << 20))", memory_bytes=300 << 20)
    assert out.memory_exceeded


def test_control_messages_extend_the_deadline(tmp_path):
    code = ("import os,json,time; fd=int(os.environ['TRIAGE_CONTROL_FD']); "
            "time.sleep(0.5); os.write(fd, (json.dumps({'phase':'script-done'})+'\\n').encode()); time.sleep(1.5)")
    out = _run(tmp_path, code, timeout_s=1, grace_after={"script-done": 5})
    assert not out.timed_out and out.exit_code == 0 and out.messages == [{"phase": "script-done"}]
