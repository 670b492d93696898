"""The sweep's duplicate buckets and its report (markdown and HTML), on real report.json files of
`triage run` (tests/data/sweep), with the HTML page checked in headless Chromium: a click on a
header sorts its table, and nothing is wider than a 1000 px window."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from triage.report.comment import SUMMARY_LIMIT_BYTES
from triage.report.markdown import ZWSP
from triage.sweep.buckets import DivergenceSignature, bucket, signature
from triage.sweep.model import ItemResult
from triage.sweep.report import build_report, render_html, render_markdown

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "sweep"
CHROMIUM = "/usr/bin/chromium"
BUILD_A = "2.13.0+cpu (git cf30153)"
BUILD_B = "2.15.0.dev20260301+cpu (git 0d1e2f3)"
# GitHub reads markdown as CommonMark with raw HTML (then sanitized), GFM tables and strikethrough.
GFM = MarkdownIt("commonmark", {"html": True, "breaks": True}).enable("table").enable("strikethrough")

_spec = importlib.util.spec_from_file_location("sweep_screenshot", ROOT / "docs" / "sweep_screenshot.py")
sweep_screenshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep_screenshot)


def _report(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _result(name: str, *, key: str | None = None, title: str | None = None, torch_build: str = BUILD_A,
            report: dict | None = None, **fields) -> ItemResult:
    """An ItemResult of the real report `name` (or `report`, a changed copy of one)."""
    data = report if report is not None else _report(name)
    verdict = data["verdict"]
    return ItemResult(key=key or f"{name}.py", kind="script", title=title or name,
                      content_sha256=fields.pop("content_sha256", name), torch_build=torch_build,
                      arms=fields.pop("arms", ",".join(data["arms_requested"])), outcome="triaged",
                      verdict_kind=verdict["kind"], expected=verdict["expected"], summary=verdict["summary"],
                      report=data, seconds=data["seconds"], **fields)


def _failed(key: str = "pytorch/pytorch#161150", error: str = "the Ray node died") -> ItemResult:
    return ItemResult(key=key, kind="issue", title="a failed item", content_sha256="f", torch_build=BUILD_A,
                      arms="", outcome="failed", error=error)


def _sweep(results: list[ItemResult], title: str = "sweep"):
    return build_report(results, title=title, torch_builds=[BUILD_A, BUILD_B], sources=["fixtures/"],
                        started="2026-03-02T09:00:00Z", seconds=60.0)


# -- signatures --------------------------------------------------------------------------------
def test_signature_of_a_compile_divergence_names_its_minimal_op():
    assert signature(_result("compile_acosh")) == DivergenceSignature(
        ops=("aten.acosh",), dtypes=("float32",), arm_kinds=("eager-vs-compile",), verdict="nonfinite-flip", cause="")


def test_signature_cause_is_the_agreeing_switch_else_the_accuracy_notes_section():
    mode = signature(_result("fp16_intermediate_compile"))
    assert (mode.ops, mode.dtypes, mode.verdict, mode.cause) == (
        ("aten.div", "aten.mul"), ("float16",), "expected-precision-mode", "emulate_precision_casts=on")
    overflow = signature(_result("fp16_overflow"))  # no minimal, no localization: the diverging value's op
    assert (overflow.ops, overflow.dtypes, overflow.arm_kinds, overflow.cause) == (
        ("aten.softplus",), ("float16", "float32"), ("script-comparison",), "Extremal values")
    singular = signature(_result("singular_logdet"))  # one arm, judged against float64 alone
    assert (singular.ops, singular.arm_kinds, singular.verdict) == ((), ("vs-float64",), "expected-ill-conditioned")


@pytest.mark.parametrize("a, b, kind", [("cpu", "cuda", "cpu-vs-cuda"),
                                        ("cuda:0", "cuda:1/compile", "eager-vs-compile"),
                                        ("cpu", "cuda/compile", "cpu-vs-cuda+eager-vs-compile"),
                                        ("cpu", "cpu/threads=1", "vs-threads=1"),
                                        ("cuda/compile", "cuda/compile=aot_eager", "inductor-vs-aot_eager")])
def test_arm_kinds_say_what_was_compared(a, b, kind):
    data = _report("compile_acosh")
    data["comparison"]["divergence"]["a"]["arm"], data["comparison"]["divergence"]["b"]["arm"] = a, b
    assert signature(_result("compile_acosh", report=data)).arm_kinds == (kind,)


@pytest.mark.parametrize("result", [_result("gh-100466"), _result("syntax_error"), _failed()],
                         ids=["not-reproduced", "could-not-run", "failed"])
def test_nothing_diverged_means_no_signature_and_no_bucket(result):
    assert signature(result) is None
    assert bucket([result]) == ([], [])


# -- buckets and near matches ------------------------------------------------------------------
def test_the_same_acosh_divergence_from_two_scripts_and_two_builds_is_one_bucket():
    results = [_result("compile_acosh", key="pytorch/pytorch#183768"), _result("fp16_overflow"),
               _result("acosh_backend"), _result("acosh_backend", torch_build=BUILD_B), _result("gh-100466")]
    buckets, near = bucket(results)
    assert [len(b.members) for b in buckets] == [3, 1]  # largest first
    assert [m.key for m in buckets[0].members] == ["pytorch/pytorch#183768", "acosh_backend.py", "acosh_backend.py"]
    assert buckets[0].signature.ops == ("aten.acosh",) and near == []


def test_a_bucket_counts_items_not_builds():
    """One report swept on two torch builds is one item of its bucket, not a duplicate: the
    report counts distinct items and orders buckets by them."""
    results = [_result("fp16_overflow"), _result("fp16_overflow", torch_build=BUILD_B),
               _result("compile_acosh", key="pytorch/pytorch#183768"), _result("acosh_backend")]
    report = _sweep(results)
    assert [(len(b.rows), b.items) for b in report.buckets] == [(2, 2), (2, 1)]
    markdown = render_markdown(report)
    assert "| bucket | items | ops |" in markdown
    row = next(line for line in markdown.splitlines() if "fp16" in line and line.startswith("| <code>b-"))
    assert row.split(" | ")[1] == "1", row


def test_the_same_op_in_another_dtype_is_a_near_match_never_merged():
    results = [_result("compile_acosh"), _result("f64_acosh_compile"), _result("acosh_backend")]
    buckets, near = bucket(results)
    assert [(b.signature.dtypes, len(b.members)) for b in buckets] == [(("float32",), 2), (("float64",), 1)]
    assert len(near) == 1
    assert (near[0].a, near[0].b) == (buckets[0], buckets[1])
    assert near[0].differs == ("dtype",) and near[0].shares == ("ops", "arms", "verdict", "cause")


def test_the_same_ops_with_another_cause_or_verdict_are_near_matches():
    other_cause = _report("fp16_intermediate_compile")
    for a in other_cause["ablations"]:
        if a["switch"] == "mkldnn=off":
            a["outcome"] = "agree-bitwise"
        elif a["switch"] == "emulate_precision_casts=on":
            a["outcome"] = "still-diverges"
    other_verdict = _report("fp16_intermediate_compile")
    other_verdict["verdict"]["kind"] = "likely-bug"
    buckets, near = bucket([_result("fp16_intermediate_compile"), _result("x", report=other_cause),
                            _result("y", report=other_verdict)])
    assert len(buckets) == 3
    assert sorted(m.differs for m in near) == [("cause",), ("verdict",), ("verdict", "cause")]


def test_buckets_are_deterministic():
    results = [_result(n) for n in ("compile_acosh", "f64_acosh_compile", "acosh_backend", "fp16_overflow",
                                    "hilbert_solve", "matmul_chain_fault", "matmul_chain_raise")]
    first, again = bucket(results), bucket(list(results))
    assert [(b.signature, [id(m) for m in b.members]) for b in first[0]] == [
        (b.signature, [id(m) for m in b.members]) for b in again[0]]
    assert [b.signature.id for b in first[0]] == [b.signature.id for b in again[0]]
    assert re.fullmatch(r"b-[0-9a-f]{8}", first[0][0].signature.id)
    shuffled = list(results)
    random.Random(1).shuffle(shuffled)
    assert render_markdown(_sweep(shuffled)) == render_markdown(_sweep(results))


# -- the report --------------------------------------------------------------------------------
def _sample() -> list[ItemResult]:
    return sweep_screenshot.load_results()[0]


def _markdown_text(markdown: str) -> str:
    """What a reader of the markdown sees on GitHub, whitespace folded."""
    return re.sub(r"\s+", " ", _Page.of(GFM.render(markdown)).text.replace(ZWSP, ""))


def test_an_item_that_diverges_on_one_build_and_not_another_says_so():
    report = _sweep(_sample())
    assert [(c.key, c.line) for c in report.build_changes] == [
        ("pytorch/pytorch#183768", f"reproduces on {BUILD_A}, not on {BUILD_B}")]
    line = ("torch.compile returns inf for torch.acosh on large finite float32 inputs while eager returns finite "
            f"values: reproduces on {BUILD_A}, not on {BUILD_B}")
    assert line in _markdown_text(render_markdown(report))
    assert line in _Page.of(render_html(report)).text


def test_groups_follow_the_verdict_order_and_no_longer_reproduces_lists_evidence():
    results = _sample()
    not_reproduced = _report("gh-100466")
    not_reproduced["verdict"]["evidence"] = ["every one of the 8 observables is bit-identical on both arms"]
    results.append(_result("gh-100466", key="pytorch/pytorch#5", torch_build=BUILD_B, report=not_reproduced))
    report = _sweep(results)
    assert [g.kind for g in report.groups] == ["likely-bug", "nonfinite-flip", "crash-one-arm",
                                               "expected-precision-mode", "expected-ill-conditioned",
                                               "not-reproduced", "could-not-run"]
    assert report.counts["failed"] == 1 and report.counts["nonfinite-flip"] == 5
    assert [(b, [r.key for r in rows]) for b, rows in report.no_longer_reproduces] == [
        (BUILD_A, ["pytorch/pytorch#100466"]),
        (BUILD_B, ["pytorch/pytorch#100466", "pytorch/pytorch#183768", "pytorch/pytorch#5"])]
    text = _markdown_text(render_markdown(report))
    section = text[text.index(f"No longer reproduces on {BUILD_B}"):]
    assert ("pytorch/pytorch#5 gh-100466 (cpu, cpu/compile): The arms agree bitwise on all 8 aligned observables"
            in section)
    assert "every one of the 8 observables is bit-identical on both arms" in section
    assert "every one of the 8 observables is bit-identical on both arms" in _Page.of(render_html(report)).text


def test_could_not_run_reasons_and_failed_items_are_listed():
    report = _sweep(_sample() + [_failed("pytorch/pytorch#7", "triage raised KeyError: 'spec'")])
    assert [(c.reason, len(c.rows)) for c in report.could_not_run] == [
        ("triage could not run the script: syntax_error.py has a syntax error: '(' was never closed (line 2).", 2)]
    assert [(r.key, r.error) for r in report.failed] == [
        ("pytorch/pytorch#161150", "the Ray node running it died (ActorDiedError: node-3 was lost) and its 3 retries "
                                   "failed the same way"), ("pytorch/pytorch#7", "triage raised KeyError: 'spec'")]
    text = _markdown_text(render_markdown(report))
    assert "syntax_error.py has a syntax error: '(' was never closed (line 2). — bad/syntax_error.py on" in text
    assert "triage raised KeyError: 'spec'" in text and "ActorDiedError: node-3 was lost" in text


def test_markdown_fits_githubs_limit_and_a_job_summarys():
    many = [dataclasses.replace(r, key=f"pytorch/pytorch#{100000 + i}", summary=r.summary * 3)
            for i, r in enumerate(_sample() * 60)]
    report = _sweep(many)
    comment = render_markdown(report)
    assert len(comment) <= 65536
    assert "more (the HTML report lists them all)" in _markdown_text(comment)
    summary = render_markdown(report, limit=SUMMARY_LIMIT_BYTES, size=lambda t: len(t.encode()))
    assert len(summary.encode()) <= SUMMARY_LIMIT_BYTES and len(summary) > len(comment)
    tiny = render_markdown(report, limit=3000)
    assert len(tiny) <= 3000
    assert tiny.rstrip().endswith("… (truncated to fit the limit: the HTML report has every result)")
    small = render_markdown(_sweep(_sample()))
    assert "more (the HTML report lists them all)" not in _markdown_text(small) and len(small) < 65536


# -- hostile text ------------------------------------------------------------------------------
HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))",
           "![tracker](https://evil.example/pixel.png)", "@pytorch/triage-team look #1234 GH-99 www.evil.example",
           "a | b | c", "</td></tr></table><b>bold</b>", "`</code><script>alert(2)</script>`", "**bold** _it_ ~~x~~",
           "\x1b]52;c;ZXZpbA==\x07 \u202eevil"]


def _hostile_results() -> list[ItemResult]:
    results = []
    for i, text in enumerate(HOSTILE):
        data = _report("compile_acosh" if i % 2 else "gh-100466")
        data["verdict"]["summary"] = f"summary {text}"
        data["verdict"]["evidence"] = [f"evidence {text}"]
        if data["minimal"]:  # a diverging report: its signature, shown in the buckets, is hostile too
            data["minimal"]["ops"] = [f"aten.{text}"]
            data["comparison"]["divergence"]["dtype"] = f"float32 {text}"
        results.append(_result("x", report=data, key=f"{text} #{i}", title=text, url="javascript:alert(1)",
                               torch_build=f"{text} build", content_sha256=str(i)))
    results.append(_failed(key="<script>alert(3)</script>", error="<script>alert(4)</script>"))
    return results


def test_hostile_titles_and_summaries_are_inert_in_markdown():
    markdown = render_markdown(_sweep(_hostile_results(), title="<script>alert(5)</script>"))
    page = _Page.of(GFM.render(markdown))
    # No element but those the template writes: no script, image or link, no attribute from a value.
    assert {tag for tag, _ in page.elements} <= {"h2", "h3", "h4", "p", "ul", "li", "table", "thead", "tbody", "tr",
                                                  "th", "td", "code", "wbr", "strong", "br"}
    assert all(not attrs or tag in ("th", "td") for tag, attrs in page.elements)  # GFM's own alignment only
    text = page.text.replace(ZWSP, "")
    for hostile in HOSTILE[:-1]:  # a `code span` shows as code, without its backticks
        assert hostile.replace("`", "") in text, hostile
    assert "\x1b" not in markdown and "\u202e" not in markdown  # written out as escapes
    assert "\\x1b]52;c;ZXZpbA==\\x07 \\u202eevil" in text
    assert "@\u200bpytorch" in markdown and "#\u200b1234" in markdown  # no mention, no cross-reference


def test_hostile_titles_and_summaries_are_inert_in_html():
    html = render_html(_sweep(_hostile_results(), title="<script>alert(5)</script>"))
    page = _Page.of(html)
    assert [tag for tag, _ in page.elements].count("script") == 1  # the page's own
    assert not [(tag, name) for tag, attrs in page.elements for name, _ in attrs if name.startswith("on")]
    assert "img" not in {tag for tag, _ in page.elements}
    hrefs = [value for tag, attrs in page.elements for name, value in attrs if name == "href"]
    assert hrefs and all(h.startswith("#") or h.startswith("https://") for h in hrefs)  # never javascript:
    for hostile in HOSTILE[:-1]:
        assert hostile.replace("`", "") in page.text, hostile
    assert "<script>alert(5)</script>" in page.text and "\x1b" not in html and "\u202e" not in html


def test_html_is_self_contained_and_runs_only_its_own_script():
    html = render_html(_sweep(_sample()))
    page = _Page.of(html)
    assert not {"link", "img", "iframe", "object", "embed"} & {tag for tag, _ in page.elements}
    assert not [value for _, attrs in page.elements for name, value in attrs if name == "src"]
    csp = next(dict(attrs)["content"] for tag, attrs in page.elements
               if tag == "meta" and dict(attrs).get("http-equiv") == "Content-Security-Policy")
    assert csp.startswith("default-src 'none'; style-src 'sha256-") and "script-src 'sha256-" in csp
    assert "unsafe-inline" not in csp


# -- in Chromium -------------------------------------------------------------------------------
def _chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: the sweep page's checks need it (apt-get install chromium)")
    return CHROMIUM


def _rows(chromium, table: str) -> list[str]:
    return chromium.evaluate(f"Array.from(document.querySelector({json.dumps(table)}).tBodies[0].rows, "
                             "r => r.cells[0].textContent + ' @ ' + r.cells[5].textContent)")


def _click_header(chromium, table: str, header: str) -> None:
    """A mouse click on the header `header` of `table`, at the button's centre."""
    x, y = chromium.evaluate(f"""(() => {{
        const button = Array.from(document.querySelector({json.dumps(table)}).tHead.querySelectorAll("button"))
          .find(b => b.textContent === {json.dumps(header)});
        button.scrollIntoView({{block: "center"}});
        const box = button.getBoundingClientRect();
        return [box.x + box.width / 2, box.y + box.height / 2];
    }})()""")
    chromium.click(x, y)


def test_a_click_on_a_header_sorts_the_table_in_chromium(tmp_path):
    page = tmp_path / "sweep.html"
    page.write_text(render_html(_sweep(_sample())))
    table = "#verdict-nonfinite-flip + table"
    with sweep_screenshot.DevTools(_chromium(), width=1000, height=800) as chromium:
        chromium.open(page.as_uri())
        as_built = [f"fp16_overflow.py @ {BUILD_A}", f"judge/acosh_backend.py @ {BUILD_A}",
                    f"judge/acosh_backend.py @ {BUILD_B}", f"pytorch/pytorch#183768 @ {BUILD_A}",
                    f"scripts/f64_acosh_compile.py @ {BUILD_A}"]
        assert _rows(chromium, table) == as_built
        _click_header(chromium, table, "seconds")  # 1.0, 21.1, 21.1, 10.3, 25.4 s as built
        assert _rows(chromium, table) == [as_built[0], as_built[3], as_built[1], as_built[2], as_built[4]]
        assert chromium.evaluate(f"document.querySelector({json.dumps(table)}).tHead.rows[0].cells[6]"
                                 ".getAttribute('aria-sort')") == "ascending"
        _click_header(chromium, table, "seconds")
        assert _rows(chromium, table) == [as_built[4], as_built[1], as_built[2], as_built[3], as_built[0]]
        _click_header(chromium, table, "item")
        assert _rows(chromium, table) == as_built
        _click_header(chromium, table, "item")
        assert _rows(chromium, table) == [as_built[4], as_built[3], as_built[1], as_built[2], as_built[0]]


def test_the_page_fits_1000_px_and_hostile_text_runs_nothing_in_chromium(tmp_path):
    long_words = [dataclasses.replace(r, key="k" * 200 + str(i), title="T" * 400, torch_build="B" * 120,
                                      summary="S" * 1000, content_sha256=f"long{i}")
                  for i, r in enumerate(_sample()[:3])]
    page = tmp_path / "sweep.html"
    page.write_text(render_html(_sweep(_sample() + _hostile_results() + long_words)))
    with sweep_screenshot.DevTools(_chromium(), width=1000, height=800) as chromium:
        chromium.open(page.as_uri())
        layout = chromium.evaluate(sweep_screenshot.OVERFLOW)
        assert layout["windowWidth"] == 1000
        assert layout["pageWidth"] <= layout["windowWidth"] and layout["wide"] == []
        assert not [e for e in chromium.events if e.get("method") == "Page.javascriptDialogOpening"]
        shown = chromium.evaluate("document.body.innerText")
        assert "<script>alert(1)</script>" in shown and "<img src=x onerror=alert(1)>" in shown
        assert chromium.evaluate("document.querySelectorAll('script').length") == 1
        # The page's own script ran under its Content-Security-Policy: its sort handler works.
        _click_header(chromium, "#verdict-nonfinite-flip + table", "seconds")
        assert chromium.evaluate("document.querySelector('#verdict-nonfinite-flip + table th[aria-sort]')"
                                 ".textContent") == "seconds"


def test_the_screenshot_script_writes_the_page_and_a_png(tmp_path):
    _chromium()
    png, html = tmp_path / "sweep.png", tmp_path / "sweep.html"
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "sweep_screenshot.py"), "--png", str(png),
                           "--html", str(html), "--width", "1000", "--chromium", CHROMIUM],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr  # 1: something wider than the window
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.read_text() == render_html(sweep_screenshot.sample_report())


# -- HTML as parsed ----------------------------------------------------------------------------
class _Page(HTMLParser):
    """Every element (tag, attributes) of an HTML text, and its text as read (character
    references read, the style and script left out)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, list[tuple[str, str | None]]]] = []
        self._chunks: list[str] = []
        self._raw = False

    @classmethod
    def of(cls, html: str) -> _Page:
        page = cls()
        page.feed(html)
        page.close()
        return page

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, attrs))
        self._raw = tag in ("style", "script")
        if tag in ("br", "li", "p", "tr", "td", "th"):
            self._chunks.append(" ")

    def handle_endtag(self, tag: str) -> None:
        self._raw = False

    def handle_data(self, data: str) -> None:
        if not self._raw:
            self._chunks.append(data)


def test_items_judged_from_posted_numbers_have_their_own_column():
    """An item whose CUDA side was judged from what its reporter posted says so in its row; an
    item whose arms all ran here shows a dash."""
    posted = _report(sorted(p.stem for p in DATA.glob("*.json"))[0])
    posted["reported"] = {"values": [{"printed": "-108.3", "judgement": {"status": "judged", "zone": "inside"}},
                                     {"printed": "5.5", "judgement": None}]}
    plain = _result(sorted(p.stem for p in DATA.glob("*.json"))[1])
    report = _sweep([_result("x", key="posted.py", report=posted), plain])
    rows = {r.key: r for g in report.groups for r in g.rows}
    assert rows["posted.py"].reported == "1 of 2 posted values judged" and rows[plain.key].reported == "—"
    markdown = render_markdown(report)
    assert "| reported arm |" in markdown and "1 of 2 posted values judged" in markdown
    assert "1 of 2 posted values judged" in render_html(report)
