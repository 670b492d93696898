"""Running issue code: the reporter's script may lie about its own result, and nothing more.

    jail.py         the namespace sandbox (bubblewrap): what a jailed process sees and may write;
                    `isolation()` says whether this machine has it, or why not
    process.py      starting a jailed process and watching it: one deadline only triage sets,
                    memory and tasks of the whole tree, disk, bounded control pipe, kill
    proctable.py    the host's process table from /proc: a tree's processes and their memory
    forkservers.py  the fork servers open in this process (zygote.py registers, process.py forks)
    confine.py      what a job applies to itself before any issue code runs: Landlock (files,
                    TCP, signals, abstract sockets) and a seccomp deny list; irrevocable
    cgroups.py      a memory and pids cgroup per job, joined before its first instruction
    environment.py  secrets: the allow-listed environment of an arm, and triage's own scrub
    caches.py       what outlives a run (collect_env text, the compile cache, the fork server's
                    warm-up probes), kept where arms cannot write it, or scoped to the one
                    script that may poison it and never mounted from a folder it can write
    zygote.py       the fork server: arms forked from a jailed process that imported torch
    torch_envs.py   other torch releases (`cpu/compile@2.15.0`, `sweep --torch`): one cached
                    venv per release, with a copy of this triage's worker; mounted read-only

The threat model (README "Security model", docs/security.md): the script runs in the same
interpreter as triage's observer, so it can forge what its own arm reports.  It must not be
able to read a secret, reach the network, write outside its scratch directory, outlive its
arm, exhaust the host, change triage or a later run, make triage crash, hang or lose the
report, or make the bot act on another issue.
"""
from triage.sandbox.environment import scrub_own_secrets, scrubbed_environment, take_secret
from triage.sandbox.jail import NAMESPACE, PROCESS, Confinement, Isolation, isolation
from triage.sandbox.process import (
    Limits,
    OutputCapture,
    ProcessOutcome,
    SandboxedProcess,
    physical_memory,
    run_isolated,
)

__all__ = ["NAMESPACE", "PROCESS", "Confinement", "Isolation", "Limits", "OutputCapture", "ProcessOutcome",
           "SandboxedProcess", "isolation", "physical_memory", "run_isolated", "scrub_own_secrets",
           "scrubbed_environment", "take_secret"]
