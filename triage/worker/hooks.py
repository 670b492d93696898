"""The trace and profile functions a script installs (``sys.settrace``, ``sys.setprofile``
and their ``threading`` versions).

Triage watches them for two reasons:
* an exception raised inside such a hook comes from the interpreter calling it, not from
  the script's own check of its values (`triage.worker.claims`);
* triage's own work after the script (the float64 replay, the rounding simulation) must not
  run under them: `run_script` removes them the moment the script ends.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import CodeType, ModuleType
from typing import Any

# Bound before any script runs: the script may replace the module attributes.
_set_trace = sys.settrace
_set_profile = sys.setprofile
_INSTALLERS = ("settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads")


class ScriptHooks:
    """While installed, records the code of every trace or profile function the script sets."""

    def __init__(self) -> None:
        self.codes: set[CodeType] = set()
        self._originals: list[tuple[ModuleType, str, Callable[..., Any]]] = []

    def install(self) -> None:
        for module in (sys, threading):
            for name in _INSTALLERS:
                original = getattr(module, name, None)
                if original is not None:
                    self._originals.append((module, name, original))
                    setattr(module, name, self._recording(original))

    def remove(self) -> None:
        """Put the original installers back and clear the hooks new threads would get."""
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()
        threading.settrace(None)
        threading.setprofile(None)

    def _recording(self, install: Callable[..., Any]) -> Callable[..., Any]:
        def recording_install(function: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                code = _code_of(function)
            except Exception:  # noqa: BLE001 - an odd callable: the real installer has the say
                code = None
            if code is not None:
                self.codes.add(code)
            return install(function, *args, **kwargs)

        return recording_install


def run_script(code: CodeType, namespace: dict[str, Any]) -> None:
    """``exec`` the script; whatever it raises propagates. Its trace and profile hooks on this
    thread are gone when this returns."""
    try:
        exec(code, namespace)
    finally:
        # No Python-level call may come first: a trace hook would see it. A profile hook still
        # gets this very call's event and may raise at it, but the interpreter removes a hook
        # that raises, so both are gone either way.
        try:
            _set_profile(None)
        finally:
            _set_trace(None)


def _code_of(function: Any) -> CodeType | None:
    """The code a hook runs: a function's or bound method's, or a callable object's __call__."""
    for candidate in (function, getattr(function, "__call__", None)):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    return None
