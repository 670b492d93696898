import json
from pathlib import Path

import jsonschema

from triage import __version__
from triage.classify import classify
from triage.model import Repro, Report
from triage.report import COMMENT_LIMIT, MARKER, render_comment, report_json

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "templates" / "report.schema.json").read_text())


def _report(source="print(1)\n"):
    repro = Repro(path="/tmp/x.py", name="x.py", source=source, problem="no such file: x.py")
    return Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=classify(repro, None),
                  triage_version=__version__, seconds=0.1)


def test_json_report_matches_its_schema():
    data = report_json(_report())
    jsonschema.validate(data, SCHEMA)
    assert data["verdict"]["kind"] == "could-not-run"


def test_comment_has_marker_verdict_and_a_fence_that_cannot_be_escaped():
    text = render_comment(_report(source="x = '```'\n```\n<script>alert(1)</script>\n"))
    assert text.startswith(MARKER) and "`could-not-run`" in text
    assert "````python" in text  # a longer fence than any backtick run in the source


def test_comment_stays_under_githubs_limit():
    text = render_comment(_report(source="x = 1\n" * 200_000))
    assert len(text) <= COMMENT_LIMIT
