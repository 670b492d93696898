"""The worker process's own plumbing, set up before any of the reporter's code runs.

A worker is started with ``python -I``, which ignores ``PYTHONUNBUFFERED`` and
``PYTHONFAULTHANDLER``: without this module, what a script prints sits in a pipe buffer and
is lost when the script crashes, hangs into the timeout or calls ``os._exit``, and a
segfault leaves no trace of where it happened.

The script runs in this same interpreter and may replace anything it can reach
(``json.dumps``, ``builtins.print``, ``sys.stdout``); what triage itself needs after the
script ran is bound here, at import, before the script exists.
"""
from __future__ import annotations

import faulthandler
import io
import json
import os
import resource
import sys
from typing import Any, NoReturn

# The encoder triage writes its control messages and result files with.
to_json = json.JSONEncoder(default=str).encode
open_file = io.open
replace_file = os.replace

# The standard streams as triage set them up: `exit_now` flushes these, not whatever the
# script left in sys.stdout.
_own_streams: list[io.TextIOWrapper] = []
# Python's original stream objects: while they live, collecting them cannot close fds 1 and 2.
_replaced_streams: list[Any] = []


def unbuffered_output() -> None:
    """Make stdout and stderr write straight to their file descriptors, as ``python -u`` does,
    and have faulthandler dump the Python stack (the script's frame included) on a fatal
    signal such as SIGSEGV."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        original = getattr(sys, name)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False),
                                  encoding=getattr(original, "encoding", None) or "utf-8",
                                  errors=getattr(original, "errors", None) or "backslashreplace",
                                  write_through=True)
        _replaced_streams.append(original)
        _own_streams.append(stream)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def confine_self() -> None:
    """Confine this process for good (sandbox/confine.py: Landlock, seccomp) with the rules
    triage's parent computed for it (sandbox/jail.py `confinement_rules`), before anything
    of the issue's runs and before any thread starts.  A mechanism the kernel has that fails
    to apply raises: the worker then stops before the script is read."""
    rules = os.environ.pop("TRIAGE_CONFINE", None)
    if rules is None:
        return  # not started by triage's sandbox (a worker run by hand); nothing to apply
    from triage.sandbox.confine import confine

    spec = json.loads(rules)
    confine(writable=spec["writable"], readable=spec["readable"], devices=spec["devices"],
            deny_tcp=bool(spec["deny_tcp"]))


def limit_address_space(limit: int) -> None:
    """Cap this process's address space: the arm's memory limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # an unprivileged process cannot raise its hard limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def exit_now(code: int) -> NoReturn:
    """End the process at once. A normal exit would wait for the script's non-daemon threads
    and run its atexit handlers, which can take forever or rewrite the result files after
    triage wrote them; everything triage reports is written before this is called."""
    for stream in _own_streams:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
