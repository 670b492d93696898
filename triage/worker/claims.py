"""Whether the exception that ended a script is the script's own check failing.

A reporter's script usually ends by checking the values it computed: ``assert``,
``torch.testing.assert_close``, ``numpy.testing.assert_allclose``, ``sys.exit(1)`` after a
comparison, or a ``raise`` in a helper of its own.  Such a failure is the script's *claim*
about those values, and the values are what triage compares; it is not a failure to run.
An error raised inside torch or the compiler (an op's RuntimeError, a shape error, an
InductorError) stays a crash, and so does a check that fails before the script observed
anything (``assert torch.cuda.is_available()`` at the top): that is about the machine, not
about values.  Neither is a ``raise`` inside a trace or profile hook the script installed
(the interpreter calls it, not the script's check), nor a ``KeyboardInterrupt`` or other
exception outside ``Exception`` that the script raises itself.
"""
from __future__ import annotations

import dis
import os
from collections.abc import Collection
from types import CodeType, TracebackType

RAISE_OPCODE = dis.opmap["RAISE_VARARGS"]  # both `raise` and a failing `assert` end in it
TESTING_HELPERS = ("torch/testing/", "numpy/testing/")
TRIAGE_WORKER = "triage/worker/"
EXIT_BUILTINS = "_sitebuiltins"  # exit() and quit() raise SystemExit from here (frozen or not)


def is_claim(e: BaseException, script: str, observed: bool, hooks: Collection[CodeType] = ()) -> bool:
    """True when `e` is the script's own check failing after it observed at least one value.
    `hooks`: the code of the trace and profile functions the script installed."""
    return observed and _chain_is_checks(e, script, hooks)


def claim_summary(e: BaseException, line: int | None) -> str:
    """What people read for a failed claim: the script's check, not triage, stopped the run."""
    where = f" at line {line}" if line is not None else ""
    if isinstance(e, SystemExit) and isinstance(e.code, int):
        how = f"it exited with status {e.code}"
    elif isinstance(e, SystemExit):
        how = f"it exited with the message {str(e.code)[:300]!r}"
    else:
        message = next((part.strip() for part in str(e).splitlines() if part.strip()), "")
        how = f"{type(e).__name__}: {message[:300]}" if message else type(e).__name__
    return f"the script's own check failed{where} ({how})"


def _chain_is_checks(e: BaseException, script: str, hooks: Collection[CodeType]) -> bool:
    """`e` and whatever it was raised from or while handling are all the script's checks:
    ``except RuntimeError: sys.exit(1)`` around a torch error is still a crash."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not _raised_by_check(current, script, hooks):
            return False
        current = current.__cause__ or current.__context__
    return True


def _raised_by_check(e: BaseException, script: str, hooks: Collection[CodeType]) -> bool:
    if not isinstance(e, (Exception, SystemExit)):
        return False
    frames = [tb for tb in _walk(e.__traceback__) if TRIAGE_WORKER not in _filename(tb)]
    if not frames or any(tb.tb_frame.f_code in hooks for tb in frames):
        return False
    if isinstance(e, SystemExit):
        callers = [tb for tb in frames if EXIT_BUILTINS not in _filename(tb)]
        return e.code not in (None, 0) and bool(callers) and callers[-1].tb_frame.f_code.co_filename == script
    innermost = frames[-1]
    if isinstance(e, AssertionError) and any(part in _filename(innermost) for part in TESTING_HELPERS):
        return any(tb.tb_frame.f_code.co_filename == script for tb in frames)
    if innermost.tb_frame.f_code.co_filename != script:
        return False
    # Raised by a `raise` or `assert` statement itself, not by an expression evaluated on the
    # same line (`assert (a @ b).sum() > 0` where the matmul fails is a crash).
    code = innermost.tb_frame.f_code.co_code
    return 0 <= innermost.tb_lasti < len(code) and code[innermost.tb_lasti] == RAISE_OPCODE


def _walk(tb: TracebackType | None) -> list[TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _filename(tb: TracebackType) -> str:
    return tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
