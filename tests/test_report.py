import dataclasses
import json
import math
import re
from pathlib import Path

import jsonschema

from triage import __version__, policy
from triage.classify.ladder import classify
from triage.classify.wording import difference_text, rounding_cause
from triage.judge.describe import strip
from triage.model import Ablation, ArmRun, Comparison, Divergence, Judgement, Observable, Report, Repro, Side, Verdict
from triage.report.comment import COMMENT_LIMIT, MARKER, comment_digest, render_comment
from triage.report.data import report_json, validate_report
from triage.report.markdown import md
from triage.report.terminal import render_terminal
from triage.report.views import OTHER_JUDGEMENTS

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "templates" / "report.schema.json").read_text())


def test_prose_escaping_keeps_code_spans_and_stops_mentions_links_and_html():
    out = md("see `a <b> @c` and @d #12 [x](http://e) <img src=y> *em* | pipe")
    assert "<code>a &lt;b&gt; @\u200bc</code>" in out
    assert "@\u200bd" in out and "#\u200b12" in out and "\\[x\\](http:\u200b//e)" in out
    assert "&lt;img src=y&gt;" in out and "\\*em\\*" in out and "\\|" in out
    assert "\n" not in md("two\nlines")


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


# -- the rounding judgement: hand-built judged sides, hostile labels -------------------------
HOSTILE = "x`<script>alert(1)</script>` @admin | #12 ```"


def _judgement(arm, observable, label=HOSTILE, zone="inside", **kw):
    j = Judgement(arm=arm, observable=observable, label=label, line=7, dtype="float32", status="judged", zone=zone,
                  p=kw.pop("p", 0.6), samples=29, statistic=0.8, max_sample_stat=2.9, element=3, value=1.0000001,
                  reference=1.0, sigma=1e-7, envelope=[0.9999998, 1.0000002], digits=6.4, numel=4, **kw)
    j.strip = strip(j)
    return j


def _side(arm, observable):
    return Side(arm=arm, observable=observable, label=HOSTILE, line=7, dtype="float32", summary="[1, 2] float32[2]",
                kind="call")


def _judged_report(headline, others=(), evidence=(), cancellations=()):
    rounding = {"status": "judged", "reason": None, "samples": 29, "precision": "float32",
                "sample_stats": [0.5, float("inf"), 1.5],
                "flips": [{"node": "gt", "op": "aten.gt", "line": 5, "replays": 3, "of": 31}],
                "cancellations": list(cancellations)}
    runs = [ArmRun(spec=spec, device="cpu", mode="eager", status="ok", elapsed_s=1.0,
                   rounding={"seconds": 0.05, "samples": 29, "note": None},
                   observables=[Observable(index=0, kind="call", label=HOSTILE, line=7, fingerprint=None,
                                           reference=None, rounding=dict(rounding))])
            for spec in ("cpu", "cpu/compile")]
    divergence = Divergence(source="arms", observable_label=HOSTILE, line=7, a=_side("cpu", 0),
                            b=_side("cpu/compile", 0), dtype="float32", bitwise_equal=False, within_tolerance=True,
                            rtol=1.3e-6, atol=1e-5, max_abs_diff=1e-7, nonfinite_mismatch=0, numel=4,
                            judgements=list(headline))
    comparison = Comparison(arms=runs, aligned=1, alignment_note=None, leaves_identical=True, leaves_note=None,
                            divergence=divergence, divergences=1 + len(others), claims=[], conditioning=[],
                            others=[dataclasses.replace(divergence, judgements=[j]) for j in others])
    verdict = Verdict(kind="expected-rounding", expected=True, policy_section=policy.GENERAL.title,
                      policy_url=policy.GENERAL.url, labels=[], summary="rounding.", evidence=list(evidence))
    repro = Repro(path="/tmp/x.py", name="x.py", source="print(1)\n")
    return Report(repro=repro, arms_requested=["cpu", "cpu/compile"], comparison=comparison, verdict=verdict,
                  triage_version=__version__, seconds=3.0)


def _table_rows(text, header):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            return rows
        rows.append(line)
    return rows


def test_judgement_table_escapes_hostile_labels_and_keeps_its_columns():
    not_judged = Judgement(arm="cpu/compile", observable=0, label=HOSTILE, line=7, dtype="float32",
                           status="not-judged", reason="its value was not kept <b>@someone</b>")
    report = _judged_report([_judgement("cpu", 0), not_judged])
    report.ablations = [Ablation(switch="threads=1", arms=["cpu/threads=1"], outcome="agree-bitwise", detail="agree",
                                 section=policy.GENERAL.title, setting="torch.set_num_threads(1)",
                                 supports="expected-precision-mode", inside_spread=False)]
    data = report_json(report)
    assert validate_report(data) == []
    text = render_comment(data)
    assert "**Rounding judgement**" in text
    assert "<script>" not in text and "<b>" not in text and "@admin" not in text and "@someone" not in text
    rows = _table_rows(text, "| arm | x")
    assert len(rows) == 2
    for row in rows:  # a pipe in a label cannot add a column
        assert len(re.findall(r"(?<!\\)\|", row)) == 7
    assert rows[0].startswith("| <code>cpu</code> | 1.0000001 (element 3) | 1 | ±1e-07 (6.4 significant digits")
    assert "0.60 (29 samples)" in rows[0] and "inside its own rounding spread" in rows[0]
    assert "not judged: its value was not kept &lt;b&gt;@\u200bsomeone&lt;/b&gt;" in rows[1]


def test_a_claims_two_values_are_named_in_their_rows():
    report = _judged_report([_judgement("cpu", 0, label="```a``` @x"), _judgement("cpu", 1, label="b | c")])
    text = render_comment(report_json(report))
    rows = _table_rows(text, "| arm | x")
    assert rows[0].startswith("| <code>cpu</code> <code>a</code> @\u200bx | 1.0000001")
    assert rows[1].startswith("| <code>cpu</code> b \\| c | 1.0000001")
    fenced = re.search(r"````text\n(.*?)\n````", text, re.S).group(1)  # a label's backticks lengthen the fence
    assert fenced.startswith("```a``` @x:\n") and "\n\nb | c:\n" in fenced


def test_strips_sit_in_a_text_fence_one_per_drawable_side():
    outside = _judgement("cpu/compile", 0, zone="outside", p=0.03)
    outside.value, outside.statistic = 1.0000009, 9.0
    outside.strip = strip(outside)
    text = render_comment(report_json(_judged_report([_judgement("cpu", 0), outside])))
    fenced = re.search(r"```text\n(.*?)\n```", text, re.S).group(1)
    assert fenced == _judgement("cpu", 0).strip + "\n\n" + outside.strip
    assert "» cpu/compile" in fenced and "▲ cpu" in fenced
    assert "outside: 9σ, the samples reach 2.9σ" in text
    # A value outside because of nonfinite elements gets no strip: its finite element says nothing.
    nonfinite = _judgement("cpu/compile", 0, zone="outside",
                           nonfinite="outside: 3 element(s) +inf where no rounding of this computation gives +inf")
    text = render_comment(report_json(_judged_report([nonfinite])))
    assert "```text" not in text and "0.60 (29 samples), finite elements" in text


def test_a_value_computed_at_float32_and_held_in_float64_is_not_measured_by_float64_tolerance_alone():
    # `y32.double()` against `y64`: "beyond float64 tolerance" said nothing of the float32 result.
    narrow, wide = _judgement("cpu", 0, label="`y32.double()`"), _judgement("cpu", 1, label="`y64`")
    narrow.stored, wide.dtype = "float64", "float64"
    d = Divergence(source="claim", observable_label="y", line=13, a=_side("cpu", 0), b=_side("cpu", 1),
                   dtype="float64", bitwise_equal=False, within_tolerance=False, rtol=1e-7, atol=1e-7,
                   max_abs_diff=1.64e-5, nonfinite_mismatch=0, numel=4, judgements=[narrow, wide])
    assert difference_text(d).endswith("by 1.64e-05 (beyond float64 tolerance, the dtype both are held in; "
                                       "`y32.double()` was computed at float32)")
    narrow.stored = None
    assert difference_text(d).endswith("(beyond float64 tolerance)")


def test_one_side_from_a_compiled_call_is_the_cause_named_for_a_difference_inside_both_spreads():
    run = ArmRun(spec="cpu/compile", device="cpu", mode="compile", status="ok", elapsed_s=1.0, observables=[
        Observable(index=0, kind="claim", label="eager", line=23, fingerprint=None, reference=None),
        Observable(index=1, kind="claim", label="compiled", line=23, fingerprint=None, reference=None,
                   compiled_line=18)])
    d = Divergence(source="claim", observable_label="x", line=23, a=_side("cpu/compile", 0), b=_side("cpu/compile", 1),
                   dtype="float32", bitwise_equal=False, within_tolerance=True, rtol=1.3e-6, atol=1e-5,
                   max_abs_diff=6e-8, nonfinite_mismatch=0, numel=4, judgements=[])
    d.a.label, d.b.label = "`eager`", "`compiled`"
    assert rounding_cause(d, run).startswith(" `compiled` comes through the `torch.compile`d call at line 18")
    assert "order a reduction" in rounding_cause(d, run) and "float32 and round" not in rounding_cause(d, run)
    # A float16 value: inductor's fused chain computes in float32 and rounds once, which eager
    # does op by op (a new user's compiled fp16 GELU had "order a reduction" alone, and none).
    d.a.dtype = d.b.dtype = "float16"
    assert "compute a float16 chain in float32 and round to float16 once" in rounding_cause(d, run)
    run.observables[0].compiled_line = 18  # both compiled: nothing told apart
    assert "torch.compile" not in rounding_cause(d, run)


def test_a_strip_spans_as_far_as_the_samples_reach():
    # A float32 convolution of 131,072 elements: its farthest element 6.2σ out, inside because
    # every sample has one as far out (6.6σ). Drawn against ±2σ, the arm sat past the edge
    # ("» cpu") on the row that says "inside, p = 1.00".
    j = _judgement("cpu", 0, label="y", p=1.0)
    j.statistic, j.max_sample_stat, j.value = 6.2, 6.6, 1.0 + 6.2e-7
    line, marker = strip(j).split("\n")
    arm, band = marker.index("▲"), [i for i, c in enumerate(line) if c == "═"]
    assert band[0] < line.index("│") < band[-1] and band[0] <= arm <= band[-1]
    j.value, j.statistic = 1.0 + 9e-7, 9.0  # farther than any sample: past the band, on the line
    line, marker = strip(j).split("\n")
    assert "▲" in marker and marker.index("▲") > max(i for i, c in enumerate(line) if c == "═")
    j.value = 1.0 + 30e-7  # past the line's 1.5 × 6.6σ
    assert strip(j).split("\n")[1].strip() == "» cpu"


def test_other_judged_values_are_listed_once_and_capped():
    others = [_judgement("cpu", i, label=f"out{i} |`@x`") for i in range(1, 10)]
    others.append(_judgement("cpu", 1, label="out1 |`@x`"))  # the same value in a second divergence
    data = report_json(_judged_report([_judgement("cpu", 0)], others=others))
    text = render_comment(data, full_report="`report.json`")
    listed = [line for line in text.splitlines() if line.startswith("- <code>cpu</code> out")]
    assert len(listed) == OTHER_JUDGEMENTS
    assert listed[0] == "- <code>cpu</code> out1 \\|<code>@\u200bx</code> (line 7): inside (p = 0.60)"
    assert "- … and 3 more in <code>report.json</code>" in text
    # Where no report.json was written, the comment points to none.
    text = render_comment(data)
    assert "- … and 3 more\n" in text and "report.json" not in text


def test_unstable_decisions_and_cancellation_hints_are_shown_once():
    unstable = "`aten.gt` (line 5) decides otherwise than the replay rounded to nearest in 3 of 31 replays"
    hint = "`E[x²] − E[x]²` cancels: use `torch.var`"
    site = {"op": "aten.sub", "line": 4, "digits_lost": 7.4, "hint": hint, "node": "sub"}
    everywhere = {"op": "aten.sub", "line": 9, "digits_lost": "all", "hint": "another rewrite", "node": "sub_1"}
    report = _judged_report([_judgement("cpu", 0, unstable=[unstable])], cancellations=[site, everywhere])
    text = render_comment(report_json(report))
    assert text.count("decides otherwise than the replay rounded to nearest in 3 of 31 replays") == 1
    assert "cancellation at <code>aten.sub</code> (line 4) loses 7.4 digits" in text
    assert "(line 9) loses every digit: another rewrite" in text
    quoted = _judged_report([_judgement("cpu", 0, unstable=[unstable])], cancellations=[site],
                            evidence=[f"decision unstable under rounding (`cpu` x): {unstable}", f"hint: {hint}"])
    text = render_comment(report_json(quoted))
    assert text.count("decides otherwise than the replay rounded to nearest in 3 of 31 replays") == 1 and "cancellation at" not in text


def test_digest_follows_the_judgement_but_not_its_timings():
    report = _judged_report([_judgement("cpu", 0), _judgement("cpu/compile", 0)])
    before = comment_digest(report_json(report))
    for run in report.comparison.arms:
        run.rounding["seconds"], run.elapsed_s = 9.9, 7.0
    report.seconds = 42.0
    assert comment_digest(report_json(report)) == before
    report.comparison.divergence.judgements[1].zone = "outside"
    assert comment_digest(report_json(report)) != before


def test_terminal_shows_the_judgement_table_and_strips():
    from rich.console import Console

    console = Console(record=True, width=200)
    render_terminal(report_json(_judged_report([_judgement("cpu", 0)])), console)
    out = console.export_text()
    assert "rounding judgement" in out and _judgement("cpu", 0).strip in out and "<script>" in out


def test_an_index_that_rounding_moves_is_not_a_value_with_digits():
    """`topk` indices of float16 scores: "±28 (16.0 significant digits at int64)" read an index
    as a magnitude; a discrete result takes one value or another across roundings."""
    from triage.judge.describe import spread_text
    from triage.model import Judgement

    j = Judgement(arm="cpu", observable=0, label="`idx16`", line=8, dtype="int64", status="judged", zone="inside",
                  value=2530.0, reference=2502.0, sigma=28.0, envelope=[2502.0, 2530.0], digits=16.0)
    assert spread_text(j) == "2502 to 2530 across roundings (a discrete result: rounding changes which one it takes)"
    j.value, j.sigma, j.envelope = 2502.0, 0.0, [2502.0, 2502.0]
    assert spread_text(j) == "the same in every rounding (a discrete result)"


def test_a_nonfinite_value_some_roundings_reach_has_no_digit_not_a_zero_spread():
    """A hand-written loss that is inf where some roundings of it are finite: "±0: a
    computational zero" read as certainty about a value with no digit at all."""
    from triage.judge.describe import spread_text
    from triage.model import Judgement

    j = Judgement(arm="cpu", observable=0, label="`loss`", line=8, dtype="float32", status="judged", zone="inside",
                  value=math.inf, reference=38.4, sigma=0.0, computational_zero=True)
    assert spread_text(j) == "no digit at float32: some roundings of this computation give inf, others a finite value"
    j.value, j.sigma = 1e-9, 3e-9
    assert spread_text(j) == "±3e-09: a computational zero at float32 (every digit is rounding noise)"
    # inf in every replay (an overflow the program asks for): no digits to count, and no doubt.
    j.value, j.sigma, j.computational_zero, j.digits = math.inf, 0.0, False, None
    assert spread_text(j) == "inf in every rounding of this computation at float32"
    j.value, j.nonfinite = 100.0, "outside: 3 element(s) finite where every rounding of this computation is not"
    assert spread_text(j) == "nonfinite in every rounding of this computation at float32"
    # Elements without a digit among those with some are said in words, the term after.
    j.nonfinite, j.value, j.sigma, j.digits, j.zeros, j.numel = None, 1.06, 2e-7, 5.8, 241, 512
    assert spread_text(j) == ("±2e-07 (5.8 significant digits at float32; 241 of 512 elements keep no significant digit, "
                              "their rounding noise as large as themselves)")


def test_an_inside_many_sigma_out_says_how_far_its_samples_reach():
    """A bfloat16 group norm 10σ from float64 at the element shown, inside because its samples
    reach 1,000σ at elements whose spread is narrow (a thirtieth new user's): the row read
    "±0.00042 … inside" beside a value 0.0043 off, a contradiction on its face."""
    far = dataclasses.replace(_judgement("cpu", 0), statistic=10.3, max_sample_stat=1000.0)
    text = render_comment(report_json(_judged_report([far])))
    (row,) = _table_rows(text, "| arm | x")
    assert "inside its own rounding spread (10.3σ here; its samples reach 1e+03σ)" in row, row
    near = render_comment(report_json(_judged_report([_judgement("cpu", 0)])))
    assert "σ here" not in _table_rows(near, "| arm | x")[0]
