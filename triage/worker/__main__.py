"""Entry point of an arm's subprocess: ``python -I -m triage.worker JOB.json``."""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path

from triage.worker.process import confine_self, exit_now, limit_address_space, to_json, unbuffered_output
from triage.worker.protocol import WORKER_ERROR_STATUS


def main() -> int:
    confine_self()
    unbuffered_output()
    job = json.loads(Path(sys.argv[1]).read_text())
    control = os.fdopen(int(os.environ.pop("TRIAGE_CONTROL_FD")), "w", buffering=1)

    def emit(message: dict) -> None:
        try:
            control.write(to_json(message) + "\n")
        except (OSError, ValueError):
            pass

    if job.get("address_space_limit"):
        limit_address_space(int(job["address_space_limit"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from triage.worker.session import run_job, write_result

    out_dir = Path(job["result_dir"])
    try:
        write_result(run_job(job, emit), out_dir)
    except BaseException:  # noqa: BLE001 - a triage bug must still leave a readable trail
        emit({"phase": "worker-error", "error": traceback.format_exc()[-4000:]})
        return WORKER_ERROR_STATUS
    emit({"phase": "done"})
    return 0


if __name__ == "__main__":
    exit_now(main())
