"""The fork servers open in this process, by interpreter: `sandbox.zygote.fork_server`
registers one for its block, and `sandbox.process.SandboxedProcess` forks from it. A registry
of its own, so that neither of those two modules imports the other's module to find it.
"""
from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triage.sandbox.zygote import ForkServer

_open: list[ForkServer] = []
_lock = threading.Lock()


def register(server: ForkServer) -> None:
    with _lock:
        _open.append(server)


def unregister(server: ForkServer) -> None:
    with _lock:
        _open.remove(server)


def active(python: str | None = None) -> ForkServer | None:
    """The newest fork server of interpreter `python` (None: triage's own)."""
    python = python or sys.executable
    with _lock:
        return next((s for s in reversed(_open) if s.python == python), None)
