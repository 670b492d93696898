import json
from pathlib import Path

import jsonschema

from triage import __version__
from triage.classify import classify
from triage.model import Repro, Report
from triage.report import COMMENT_LIMIT, MARKER, _md, comment_digest, render_comment, report_json

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "templates" / "report.schema.json").read_text())


def test_prose_escaping_keeps_code_spans_and_stops_mentions_links_and_html():
    out = _md("see `a <b> @c` and @d #12 [x](http://e) <img src=y> *em* | pipe")
    assert "<code>a &lt;b&gt; @\u200bc</code>" in out
    assert "@\u200bd" in out and "#\u200b12" in out and "\\[x\\](http:\u200b//e)" in out
    assert "&lt;img src=y&gt;" in out and "\\*em\\*" in out and "\\|" in out
    assert "\n" not in _md("two\nlines")


def test_digest_ignores_timings_but_not_outcomes():
    a = report_json(_report())
    b = dict(a, seconds=99.0)
    assert comment_digest(a) == comment_digest(b)
    c = report_json(_report(source="print(2)\n"))
    assert comment_digest(a) != comment_digest(c)


def _report(source="print(1)\n"):
    repro = Repro(path="/tmp/x.py", name="x.py", source=source, problem="no such file: x.py")
    return Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=classify(repro, None),
                  triage_version=__version__, seconds=0.1)


def test_json_report_matches_its_schema():
    data = report_json(_report())
    jsonschema.validate(data, SCHEMA)
    assert data["verdict"]["kind"] == "could-not-run"


def test_comment_has_marker_verdict_and_a_fence_that_cannot_be_escaped():
    text = render_comment(report_json(_report(source="x = '```'\n```\n<script>alert(1)</script>\n")))
    assert text.startswith(MARKER) and "<code>could-not-run</code>" in text
    assert "````python" in text  # a longer fence than any backtick run in the source


def test_comment_stays_under_githubs_limit():
    text = render_comment(report_json(_report(source="x = 1\n" * 200_000)))
    assert len(text) <= COMMENT_LIMIT
