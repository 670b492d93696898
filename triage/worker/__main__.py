"""Entry point of an arm's subprocess: ``python -m triage.worker JOB.json``."""
from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    control = os.fdopen(int(os.environ.pop("TRIAGE_CONTROL_FD")), "w", buffering=1)

    def emit(message: dict) -> None:
        try:
            control.write(json.dumps(message, default=str) + "\n")
        except (OSError, ValueError):
            pass

    limit = job.get("address_space_limit")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from triage.worker.session import run_job, write_result

    out_dir = Path(job["result_dir"])
    try:
        result = run_job(job, emit)
    except BaseException:  # noqa: BLE001 - a triage bug must still leave a readable trail
        import traceback

        emit({"phase": "worker-error", "error": traceback.format_exc()[-4000:]})
        return 70
    write_result(result, out_dir)
    emit({"phase": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
