"""Regenerate the real output shown in README.md.

    python docs/readme_output.py

Each block in README.md between ``<!-- output: NAME -->`` and ``<!-- /output -->`` is
replaced by a fresh run of the command listed for NAME below, headed by the host it ran on,
so the README never shows output no one can reproduce. A block whose input is missing is left
as it is, and the script says so.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# name -> (arguments after `triage`, a file the run needs)
COMMANDS: dict[str, tuple[list[str], Path]] = {
    "expm1-backend": (["run", "fixtures/judge/expm1_backend.py", "--arms", "cpu,cpu/compile", "--no-minimize"],
                      ROOT / "fixtures/judge/expm1_backend.py"),
    "naive-variance": (["run", "fixtures/judge/naive_variance.py", "--arms", "cpu"],
                       ROOT / "fixtures/judge/naive_variance.py"),
    "fp16-compile": (["run", "fixtures/fp16_intermediate_compile.py", "--arms", "cpu,cpu/compile", "--no-minimize"],
                     ROOT / "fixtures/fp16_intermediate_compile.py"),
    "gh-183768": (["run", "fixtures/issues/gh-183768/repro.py", "--arms", "cpu,cpu/compile"],
                  ROOT / "fixtures/issues/gh-183768/repro.py"),
    "different-functions": (["run", "fixtures/judge/unbiased_std_vs_batch_norm.py", "--arms", "cpu"],
                            ROOT / "fixtures/judge/unbiased_std_vs_batch_norm.py"),
    "inconclusive": (["run", "fixtures/judge/expected_constant.py", "--arms", "cpu"],
                     ROOT / "fixtures/judge/expected_constant.py"),
    "reported-logdet": (["run", "fixtures/seeds/logdet_cpu_vs_cuda.py", "--reported",
                         "fixtures/seeds/logdet_reported.txt", "--no-minimize"],
                        ROOT / "fixtures/seeds/logdet_reported.txt"),
}
BLOCK = re.compile(r"(<!-- output: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /output -->)", re.S)


def host() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}, "
            f"torch {metadata.version('torch')}")


def run(args: list[str]) -> str:
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    proc = subprocess.run([sys.executable, "-m", "triage", *args, "--comment", "-", "--minimal", "-"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    # stdout is the verdict; stderr's progress lines are not part of what a reader compares.
    return proc.stdout.rstrip()


def main() -> None:
    text = README.read_text()
    where = host()

    def regenerate(match: re.Match) -> str:
        name = match["name"]
        if name not in COMMANDS:
            print(f"{name}: no command for this block; left as it is")
            return match.group(0)
        args, needs = COMMANDS[name]
        if not needs.exists():
            print(f"{name}: {needs} is missing here; left as it is")
            return match.group(0)
        print(f"{name}: triage {' '.join(args)}")
        body = f"Real output ({where}):\n\n```\n$ triage {' '.join(args)}\n{run(args)}\n```\n"
        return match.group(1) + body + match.group(4)

    README.write_text(BLOCK.sub(regenerate, text))


if __name__ == "__main__":
    main()
