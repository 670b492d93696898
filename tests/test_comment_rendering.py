"""The comment as a reader sees it on GitHub: rendered to HTML the way GitHub reads a comment,
and checked on the HTML's visible text, never on the markdown string."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from triage import __version__, policy
from triage.judge.describe import strip
from triage.model import (
    Ablation,
    ArmRun,
    Comparison,
    Divergence,
    Issue,
    IssueRepro,
    Judgement,
    LocalizedOp,
    Minimal,
    Observable,
    Report,
    Repro,
    Side,
    Verdict,
)
from triage.report.comment import MARKER, render_comment
from triage.report.data import report_json, validate_report
from triage.report.markdown import CODE_SPAN, COLUMN, ZWSP

ROOT = Path(__file__).resolve().parent.parent
# GitHub reads a comment as CommonMark with raw HTML (then sanitized), GFM tables and
# strikethrough, and a newline in a paragraph as a line break.
GFM = MarkdownIt("commonmark", {"html": True, "breaks": True}).enable("table").enable("strikethrough")
LINE_LIMIT = 120  # characters in a line of what is in view, beyond which GitHub scrolls sideways
WBR = ZWSP  # a <wbr> in the parsed text: a place a line may break, showing nothing
BLOCKS = {"p", "li", "h1", "h2", "h3", "h4", "h5", "h6", "summary", "blockquote", "sub", "pre", "tr"}
VOID = {"br", "hr", "img", "wbr", "input"}


# -- HTML as a reader sees it ----------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Element:
    tag: str
    attrs: dict[str, str | None]
    parent: Element | None
    children: list[Element | str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self):
        for child in self.children:
            if isinstance(child, Element):
                yield child
                yield from child.walk()

    def texts(self):
        """(text, the element holding it) for every text node below, in document order."""
        for child in self.children:
            if isinstance(child, str):
                yield child, self
            else:
                yield from child.texts()

    def within(self, *tags: str) -> bool:
        node = self
        while node is not None:
            if node.tag in tags:
                return True
            node = node.parent
        return False

    def folded(self) -> bool:
        """Inside a closed <details>, and not its summary: out of view until the reader opens it."""
        node, child = self.parent, self
        while node is not None:
            if node.tag == "details" and "open" not in node.attrs and child.tag != "summary":
                return True
            node, child = node.parent, node
        return False


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.current = Element("#document", {}, None)
        self.comments: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs), self.current)
        self.current.children.append(element)
        if tag == "wbr":
            element.children.append(WBR)
        elif tag == "br":
            element.children.append("\n")
        elif tag not in VOID:
            self.current = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Element(tag, dict(attrs), self.current))

    def handle_endtag(self, tag: str) -> None:
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:  # an end tag nothing opened is ignored
            self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


def parse(markdown: str) -> _Tree:
    tree = _Tree()
    tree.feed(GFM.render(markdown))
    tree.close()
    return tree


def narrowest(text: str) -> int:
    """The width of `text` laid out as narrow as it goes: its longest run without a break."""
    return max((len(run) for run in re.split(rf"[\s{WBR}]+", text)), default=0)


def lines_in_view(root: Element) -> list[str]:
    """Each line of what is in view at its narrowest: a code block's lines as they are, a table
    row drawn as `| cell | cell |` with each cell at its narrowest, and the longest run of any
    other block (prose wraps between runs)."""
    lines = []
    for element in root.walk():
        if element.folded() or element.tag not in BLOCKS:
            continue
        if element.tag == "pre":
            lines += element.text().split("\n")
        elif element.tag == "tr":
            cells = [c.text() for c in element.children if isinstance(c, Element) and c.tag in ("td", "th")]
            lines.append("| " + " | ".join("x" * narrowest(c) for c in cells) + " |")
        elif not element.within("pre", "table"):
            lines.append("x" * narrowest(element.text()))
    return lines


MARKDOWN_LEFT = re.compile(r"\\[!-/:-@\[-`{-~]|\*\*|</?[a-z]+>|&[a-z]+;|`")


def assert_renders_cleanly(markdown: str) -> _Tree:
    tree = parse(markdown)
    root = tree.root
    for text, element in root.texts():
        if element.within("pre"):
            continue  # a code block shows its text as it is
        # No backslash escape shows, in a <summary> (raw HTML: no markdown read) or anywhere else.
        assert not re.search(r"\\[!-/:-@\[-`{-~]", text), (element.tag, text)
        if not element.within("code"):
            assert "`" not in text and "**" not in text and "](" not in text, (element.tag, text)  # markdown unread
    for table in (e for e in root.walk() if e.tag == "table"):
        rows = [e for e in table.walk() if e.tag == "tr"]
        header = [e for e in rows[0].children if isinstance(e, Element) and e.tag == "th"]
        for row in rows[1:]:
            cells = [e for e in row.children if isinstance(e, Element) and e.tag == "td"]
            assert len(cells) == len(header), row.text()
            for cell in cells:
                assert cell.text().strip(), f"an empty cell in {row.text()!r}"
                assert not MARKDOWN_LEFT.search(cell.text()), cell.text()
    wide = [line for line in lines_in_view(root) if len(line) > LINE_LIMIT]
    assert not wide, f"{len(wide)} line(s) in view wider than {LINE_LIMIT}: {wide[0][:200]!r}"
    # The marker stays a hidden HTML comment.
    assert tree.comments and tree.comments[0].startswith(MARKER.removeprefix("<!--"))
    assert MARKER.removeprefix("<!-- ") not in root.text()
    return tree


def visible_text(root: Element) -> str:
    """The page's text as read: invisible characters dropped, every run of whitespace one space."""
    return re.sub(r"\s+", " ", root.text().replace(ZWSP, "")).strip()


# -- realistic reports -----------------------------------------------------------------------
ELU_SOURCE = """import torch

x = torch.randn(4096, device="cuda", dtype=torch.float16) * 8
eager = torch.nn.functional.elu(x)
compiled = torch.compile(torch.nn.functional.elu)(x)
print((eager - compiled).abs().max())
"""
MINIMAL_SCRIPT = """# Minimal repro written by triage: 1 op(s), inputs as short literals.
import torch


def f(x0):
    return torch.nn.functional.elu(x0)


x0 = torch.tensor([-7.5, -0.001, 3.0], dtype=torch.float16, device="cuda")
eager = f(x0)
compiled = torch.compile(f, backend="inductor", fullgraph=True)(x0)
print("eager:   ", eager)
print("compiled:", compiled)
"""
FLAGS_LINE = ("Flags: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
              "sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology")
ENVIRONMENT = f"PyTorch version: 2.13.0+cu130\nGPU models and configuration: GPU 0: H100\n{FLAGS_LINE}\n"
ARMS = ("cuda", "cuda/compile")
SWITCHES = {  # switch: (arms, outcome, detail, section, setting), as ablate.py and the minimizer write them
    "tf32=off": (["cuda/tf32=off", "cuda/compile/tf32=off"], "still-diverges", "max |diff| 0.0039", policy.TF32,
                 'torch.backends.cuda.matmul.fp32_precision = "ieee"; torch.backends.cudnn.conv.fp32_precision = '
                 '"ieee"'),
    "reduced_precision=off": (["cuda/reduced_precision=off", "cuda/compile/reduced_precision=off"], "still-diverges",
                              "max |diff| 0.0039", policy.REDUCED_PRECISION,
                              "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False; "
                              "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False"),
    "emulate_precision_casts=on": (["cuda", "cuda/compile/emulate_precision_casts=on"], "agree-bitwise",
                                   "the two sides are bit-identical", policy.REDUCED_PRECISION,
                                   "torch._inductor.config.emulate_precision_casts = True"),
    "deterministic=on": (["cuda/deterministic=on", "cuda/compile/deterministic=on"], "not-comparable",
                         "`cuda/compile/deterministic=on` raised: RuntimeError | no deterministic kernel",
                         policy.GENERAL, "torch.use_deterministic_algorithms(True)"),
    "float64=elu": (list(ARMS), "agree-bitwise", "the two arms' outputs are bit-identical", policy.GENERAL,
                    "compute `aten.elu` in float64 and cast back, e.g. `torch.elu(x.double()).float()`"),
}


def _side(arm: str, summary: str) -> Side:
    return Side(arm=arm, observable=0, label="compiled elu call #1", line=5, dtype="float16", summary=summary,
                max_abs_error=0.0039, max_rel_error=0.00049, max_ulps=1.0, kind="call")


def _judgement(arm: str, value: float, zone: str, statistic: float, label: str = "compiled elu call #1",
               observable: int = 0) -> Judgement:
    j = Judgement(arm=arm, observable=observable, label=label, line=5, dtype="float16", status="judged", zone=zone,
                  p=0.6 if zone == "inside" else 0.03, samples=29, statistic=statistic, max_sample_stat=2.9,
                  element=1, value=value, reference=-0.99951, sigma=0.00012, envelope=[-0.99978, -0.99924],
                  digits=3.1, numel=4096)
    j.strip = strip(j)
    return j


def _elu_report(name: str = "i2_compile_elu.py", minimal_script: str = MINIMAL_SCRIPT,
                observed: str = "tensor(0.0039, device='cuda:0', dtype=torch.float16)") -> Report:
    """A compiled-vs-eager elu divergence on CUDA with everything the comment can show: a minimal
    repro, ablations (settings as code lines and as prose with `code` spans, details with pipes),
    localization, arm details with stdout, the environment, and the issue it came from."""
    runs = [ArmRun(spec=spec, device="cuda", mode=spec.partition("/")[2] and "compile" or "eager", status="ok",
                   elapsed_s=2.5, stdout=f"{observed}\n", environment=ENVIRONMENT,
                   flags_end={"torch": "2.13.0+cu130", "cudnn_allow_tf32": True},
                   observables=[Observable(index=0, kind="call", label="compiled elu call #1", line=5,
                                           fingerprint=None, reference=None)])
            for spec in ARMS]
    divergence = Divergence(source="arms", observable_label="compiled elu call #1", line=5,
                            a=_side("cuda", "[-0.999, -0.000999, 3] float16[4096]"),
                            b=_side("cuda/compile", "[-0.9995, -0.000999, 3] float16[4096]"), dtype="float16",
                            bitwise_equal=False, within_tolerance=True, rtol=0.001, atol=1e-05,
                            max_abs_diff=0.0039, nonfinite_mismatch=0, numel=4096,
                            judgements=[_judgement("cuda", -0.99951, "inside", 0.8),
                                        _judgement("cuda/compile", -0.99902, "outside", 4.1)])
    other = dataclasses.replace(divergence, judgements=[_judgement("cuda/compile", -0.99902, "outside", 4.1,
                                                                   label="eager - compiled", observable=1)])
    comparison = Comparison(arms=runs, aligned=1, alignment_note=None, leaves_identical=True, leaves_note=None,
                            divergence=divergence, divergences=2, claims=[], conditioning=[], others=[other])
    verdict = Verdict(kind="expected-precision-mode", expected=True, policy_section=policy.REDUCED_PRECISION.title,
                      policy_url=policy.REDUCED_PRECISION.url, labels=["module: inductor", "module: half"],
                      summary="compiled elu call #1 (line 5) between arms: `cuda/compile` keeps the float16 "
                              "intermediate in float32 (max |diff| 0.0039, 1 ulp); with "
                              "`torch._inductor.config.emulate_precision_casts = True` the arms agree bitwise.",
                      evidence=["max |difference| between the sides: 0.0039 (float16 tolerance rtol=0.001, "
                                "atol=1e-05)", "with `aten.elu` alone computed in float64 on both arms the "
                                               "divergence disappears"])
    minimal = Minimal(ops=["aten.elu"], script=minimal_script, verified=True, queries=6, seconds=17.0,
                      arms=list(ARMS), kind="values differ", reliability="3 of 3 replays", original_ops=3,
                      verification="fresh runs show it")
    localization = [LocalizedOp(node="elu", op="aten.elu", line=4, role="introduced", first=True,
                                end_to_end={"kind": "rounding", "max_abs": 0.0039, "max_ulps": 1.0},
                                local={"kind": "rounding", "max_abs": 0.0039, "max_ulps": 1.0}),
                    LocalizedOp(node="sub", op="aten.sub", line=6, role="propagated", first=False,
                                end_to_end={"kind": "rounding", "max_abs": 0.0039, "max_ulps": 1.0},
                                local={"kind": "equal", "max_abs": 0.0, "max_ulps": 0.0})]
    ablations = [Ablation(switch=switch, arms=arms, outcome=outcome, detail=detail, section=section.title,
                          setting=setting, supports="expected-precision-mode")
                 for switch, (arms, outcome, detail, section, setting) in SWITCHES.items()]
    issue = Issue(repo="pytorch/pytorch", number=161234, title="elu differs under torch.compile",
                  url="https://github.com/pytorch/pytorch/issues/161234", author="someone", body_sha256="0" * 64,
                  extraction=IssueRepro(script=ELU_SOURCE, observed=[observed],
                                        environment_fields={"PyTorch version": "2.13.0+cu130", "OS": "Ubuntu 24.04"}))
    return Report(repro=Repro(path=f"/tmp/{name}", name=name, source=ELU_SOURCE), arms_requested=list(ARMS),
                  comparison=comparison, verdict=verdict, triage_version=__version__, seconds=61.5,
                  notes=["The script calls `torch.compile`: arms `cuda` (eager) and `cuda/compile`."],
                  minimal=minimal, localization=localization, issue=issue, ablations=ablations,
                  isolation={"kind": "namespace", "detail": "bubblewrap"})


def _elu_data(**kw) -> dict:
    data = report_json(_elu_report(**kw))
    assert validate_report(data) == []
    return data


# -- the checks ------------------------------------------------------------------------------
def test_a_full_comment_renders_cleanly():
    tree = assert_renders_cleanly(render_comment(_elu_data(), full_report="`report.json`"))
    text = visible_text(tree.root)
    summaries = [e.text() for e in tree.root.walk() if e.tag == "summary"]
    assert "Original repro (i2_compile_elu.py)" in summaries
    assert "Arm cuda/compile: output, exception, numerics flags" in summaries
    in_view = [e.text() for e in tree.root.walk() if e.tag == "pre" and not e.folded()]
    assert MINIMAL_SCRIPT in in_view  # the minimal repro is in view, as written
    assert "the two arms' outputs are bit-identical" in text and "RuntimeError | no deterministic kernel" in text


def test_an_inconclusive_verdict_renders_its_conflicts_and_validates():
    from triage.audit import Conflict, inconclusive

    report = _elu_report()
    report.verdict = inconclusive(report.verdict, [Conflict("printed_differences_accounted",
                                                             "`cuda` prints `max_diff: 0.0` where `cuda/compile` "
                                                             "prints `max_diff: 1.97`")])
    data = report_json(report)
    assert validate_report(data) == []
    assert data["verdict"]["withdrawn"] == "expected-precision-mode" and len(data["verdict"]["conflicts"]) == 1
    text = visible_text(assert_renders_cleanly(render_comment(data)).root)
    assert "triage: inconclusive" in text and "triage is not sure" in text
    assert "conflict: `cuda` prints `max_diff: 0.0`".replace("`", "") in text.replace("`", "")
    # A report written before the audit existed (a sweep's stored result) still validates.
    older = report_json(_elu_report())
    del older["verdict"]["conflicts"], older["verdict"]["withdrawn"]
    assert validate_report(older) == []


def test_each_installation_shows_its_own_environment():
    """Arms on another torch release ran another installation: one collect_env block per
    distinct environment, naming the arms that ran it."""
    report = _elu_report()
    release = report.comparison.arms[1]
    release.spec = "cuda/compile@2.15.0"
    release.environment = ENVIRONMENT.replace("2.13.0", "2.15.0")
    tree = assert_renders_cleanly(render_comment(report_json(report), full_report="`report.json`"))
    def environments(tree):  # as read: break points (<wbr>, the zero-width space after "@") dropped
        return [e.text().replace(WBR, "") for e in tree.root.walk()
                if e.tag == "summary" and e.text().startswith("Environment")]

    assert environments(tree) == ["Environment (torch.utils.collect_env, arm cuda)",
                                  "Environment (torch.utils.collect_env, arm cuda/compile@2.15.0)"]
    same = assert_renders_cleanly(render_comment(_elu_data(), full_report="`report.json`"))
    assert environments(same) == ["Environment (torch.utils.collect_env, arms cuda, cuda/compile)"]


def _table(root: Element, *headers: str) -> list[list[Element]]:
    """The rows (header first) of the table whose header starts with `headers`."""
    for table in (e for e in root.walk() if e.tag == "table"):
        rows = [[c for c in row.children if isinstance(c, Element)] for row in table.walk() if row.tag == "tr"]
        if [c.text().replace(ZWSP, "").split("\n")[0] for c in rows[0][:len(headers)]] == list(headers):
            return rows
    raise AssertionError(f"no table headed {headers}")


def _ablation_rows(root: Element) -> dict[str, list[Element]]:
    """The ablation table's rows by switch: (switch on arms and accuracy note, result, setting)."""
    return {row[0].text().split(" ")[0]: row for row in _table(root, "switch, on arms")[1:]}


def test_ablation_settings_read_as_code_or_as_prose_with_code():
    root = parse(render_comment(_elu_data())).root
    rows = _ablation_rows(root)
    assert list(rows) == list(SWITCHES)  # one row each: no pipe added a column
    assert [c.text() for c in rows["tf32=off"][:2]] == [
        f"tf32=off on cuda, cuda/compile\n{policy.TF32.title}", "still-diverges: max |diff| 0.0039"]
    assert rows["float64=elu"][0].text().startswith("float64=elu on cuda, cuda/compile\n")
    plain = rows["tf32=off"][2]
    assert [c.tag for c in plain.children if isinstance(c, Element)] == ["code"]  # a line of code, as code
    assert plain.text().replace(WBR, "") == SWITCHES["tf32=off"][4]
    prose = rows["float64=elu"][2]
    assert prose.text().replace(WBR, "") == ("compute aten.elu in float64 and cast back, e.g. "
                                             "torch.elu(x.double()).float()")
    assert [c.text().replace(WBR, "") for c in prose.walk() if c.tag == "code"] == [
        "aten.elu", "torch.elu(x.double()).float()"]
    detail = rows["deterministic=on"][1].text().replace(WBR, "")
    assert detail == "not-comparable: cuda/compile/deterministic=on raised: RuntimeError | no deterministic kernel"


def test_pipes_in_settings_stay_in_their_cell():
    data = _elu_data()
    data["ablations"][0]["setting"] = "flags = torch.backends.flags | MASK"  # a line of code
    data["ablations"][1]["setting"] = "set `mode = a | b` or use c | d"  # prose with code
    root = assert_renders_cleanly(render_comment(data)).root
    rows = list(_ablation_rows(root).values())
    assert rows[0][2].text().replace(WBR, "") == "flags = torch.backends.flags | MASK"
    assert rows[1][2].text() == "set mode = a | b or use c | d"
    assert [c.text() for c in rows[1][2].walk() if c.tag == "code"] == ["mode = a | b"]


def test_a_long_dotted_setting_may_wrap_at_its_dots():
    root = parse(render_comment(_elu_data())).root
    cell = _ablation_rows(root)["reduced_precision=off"][2]
    assert narrowest(cell.text()) < len("allow_fp16_reduced_precision_reduction") + 2
    assert cell.text().replace(WBR, "") == SWITCHES["reduced_precision=off"][4]  # a copy is the code as written


def test_localization_and_arms_tables_keep_their_columns():
    root = assert_renders_cleanly(render_comment(_elu_data())).root
    rows = _table(root, "op", "line")
    assert [c.text() for c in rows[1]] == ["aten.elu", "4", "first to differ; introduced",
                                           "rounding: 1 ulp, abs 0.0039", "rounding: 1 ulp, abs 0.0039"]
    assert [c.text() for c in rows[2]][3] == "bitwise equal"
    arms = _table(root, "arm", "status")
    assert [c.text() for c in arms[2]][:3] == ["cuda/compile", "ok", "[-0.9995, -0.000999, 3] float16[4096]"]


def test_rounding_judgement_shows_its_table_pictures_and_other_values():
    root = assert_renders_cleanly(render_comment(_elu_data())).root
    rows = _table(root, "arm", "compiled elu call #1", "float64")
    assert [[c.text() for c in row[:2]] for row in rows[1:]] == [["cuda", "-0.99951 (element 1)"],
                                                                 ["cuda/compile", "-0.99902 (element 1)"]]
    assert rows[2][5].text() == "outside: 4.1σ, the samples reach 2.9σ"
    pictures = [_judgement("cuda", -0.99951, "inside", 0.8).strip,
                _judgement("cuda/compile", -0.99902, "outside", 4.1).strip]
    assert "\n\n".join(pictures) + "\n" in [e.text() for e in root.walk() if e.tag == "pre" and not e.folded()]
    other = next(e for e in root.walk() if e.tag == "li" and e.text().startswith("cuda/compile eager"))
    assert other.text() == "cuda/compile eager - compiled (line 5): outside (p = 0.03)"


def test_arm_details_show_stdout_in_a_code_block():
    root = parse(render_comment(_elu_data())).root
    details = next(e for e in root.walk() if e.tag == "details" and e.text().startswith("Arm cuda/compile"))
    assert [e.text() for e in details.walk() if e.tag == "pre"][0] == (
        "tensor(0.0039, device='cuda:0', dtype=torch.float16)\n")


def test_a_code_block_wider_than_the_column_is_folded():
    hex_line = 'x0 = torch.frombuffer(bytearray.fromhex("' + "3c00" * 600 + '"), dtype=torch.float16)'
    observed = "tensor([" + ", ".join(["-0.9995"] * 40) + "])"
    data = _elu_data(minimal_script=MINIMAL_SCRIPT.replace("x0 = torch.tensor([-7.5, -0.001, 3.0], "
                                                           'dtype=torch.float16, device="cuda")', hex_line),
                     observed=observed)
    tree = assert_renders_cleanly(render_comment(data))
    folded = {e.parent.text(): e for e in tree.root.walk() if e.tag == "pre" and e.folded()}
    minimal = next(pre for summary, pre in folded.items() if summary.startswith("Minimal repro script"))
    assert hex_line in minimal.text()
    assert any(summary.startswith("What the reporter saw") for summary in folded)


@pytest.mark.parametrize("width, folded", [(COLUMN, False), (COLUMN + 1, True)])
def test_a_code_block_is_folded_from_its_first_line_wider_than_the_column(width, folded):
    script = MINIMAL_SCRIPT + "#" * width + "\n"
    root = assert_renders_cleanly(render_comment(_elu_data(minimal_script=script))).root
    assert [e.folded() for e in root.walk() if e.tag == "pre" and e.text() == script] == [folded]


@pytest.mark.parametrize("full_report", [None, "`report.json`", "`report.json` in the run's artifacts"])
def test_report_json_is_mentioned_only_where_it_was_written(full_report):
    root = assert_renders_cleanly(render_comment(_elu_data(), full_report=full_report)).root
    footer = [e for e in root.walk() if e.tag == "sub"][-1]
    assert footer.text().startswith(f"triage {__version__} · 61.5 s · arms: cuda, cuda/compile · isolation: "
                                    "namespace")
    if full_report:
        assert footer.text().endswith(" · full report in " + full_report.replace("`", ""))
    else:
        assert "report.json" not in visible_text(root)


@pytest.mark.parametrize("full_report", [None, "`report.json`"])
@pytest.mark.parametrize("limit", [2500, 4000, 5000])  # cut below a table's header, between rows, in a <details> fence
def test_a_truncated_comment_closes_what_it_cut_and_says_so_in_view(limit, full_report):
    data = _elu_data()
    data["repro"]["source"] = "y = 1\n" * 50_000  # no cap leaves it small enough: the comment is cut
    markdown = render_comment(data, limit=limit, full_report=full_report)
    assert len(markdown) <= limit and "<sub>triage" not in markdown
    root = assert_renders_cleanly(markdown).root
    last = [e for e in root.walk() if e.tag == "p"][-1]
    assert not last.folded() and not last.within("pre")
    expected = "… (truncated to fit GitHub's limit" + ("; the full report is in report.json)" if full_report else ")")
    assert last.text() == expected


# -- hostile text shows as itself ------------------------------------------------------------
METACHARACTERS = st.text(alphabet=st.sampled_from(list("<>&|_*`\\[]{}()!#~-+.=:;/'\"@$%^,?\t\n abcxyzé中0123456789")),
                         min_size=1, max_size=60)


def _shown(text: str, root: Element, opening: str, closing: str) -> str:
    """What shows of `text` between its sentinels (characters no example holds), whitespace folded."""
    found = re.search(f"{opening}(.*?){closing}", root.text().replace(ZWSP, ""), re.S)
    assert found, (opening, root.text()[:3000])
    return re.sub(r"\s+", " ", found.group(1)).strip()


def _as_read(text: str, code_spans: bool) -> str:
    """`text` as it should show: one line, and in prose its `code spans` as their code."""
    if code_spans:
        text = CODE_SPAN.sub(lambda m: m.group(2).strip() or m.group(2), " ".join(text.split("\n")))
    return re.sub(r"\s+", " ", text).strip()


@settings(max_examples=150, deadline=None)
@given(prose=METACHARACTERS, item=METACHARACTERS, cell=METACHARACTERS, name=METACHARACTERS, spec=METACHARACTERS)
def test_metacharacters_show_as_themselves(prose, item, cell, name, spec):
    data = report_json(_elu_report())
    data["verdict"]["summary"] = f"①{prose}②"  # a paragraph of its own
    data["verdict"]["evidence"] = [f"③{item}④"]  # a list item
    data["ablations"][0]["detail"] = f"⑤{cell}⑥"  # a table cell
    data["repro"]["name"] = f"⑦{name}⑧"  # inside <summary>: raw HTML, where no markdown is read
    data["arms"][1]["spec"] = f"⑨{spec}⑩"  # inline code, in a table and in a <summary>
    root = parse(render_comment(data)).root
    assert _shown(prose, root, "①", "②") == _as_read(prose, code_spans=True)
    assert _shown(item, root, "③", "④") == _as_read(item, code_spans=True)
    assert _shown(cell, root, "⑤", "⑥") == _as_read(cell, code_spans=True)
    assert _shown(name, root, "⑦", "⑧") == _as_read(name, code_spans=False)
    assert _shown(spec, root, "⑨", "⑩") == _as_read(spec, code_spans=False)
    summary = next(e for e in root.walk() if e.tag == "summary" and "⑨" in e.text())
    assert _shown(spec, summary, "⑨", "⑩") == _as_read(spec, code_spans=False)


# -- the screenshot --------------------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"


def _png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the image data) of a PNG, read by hand."""
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, width, height, data = 8, 0, 0, b""
    while pos < len(blob):
        length, kind = struct.unpack(">I4s", blob[pos:pos + 8])
        chunk = blob[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            data += chunk
        pos += 12 + length
    return width, height, len(set(zlib.decompress(data)))


@pytest.mark.slow
def test_screenshot_of_the_comment(tmp_path):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: the screenshot needs it (apt-get install chromium)")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_elu_data()))
    png, page = tmp_path / "comment.png", tmp_path / "comment.html"
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "comment_screenshot.py"), str(report), "--png", str(png),
                           "--html", str(page), "--width", "900", "--chromium", CHROMIUM],
                          capture_output=True, text=True, timeout=300, check=False)
    # Exit 1 would name a table or code block wider than the comment column, laid out by Chromium.
    assert done.returncode == 0, done.stdout + done.stderr
    width, height, colours = _png_size_and_colours(png)
    assert width == 900 and 1000 < height <= 3000
    assert colours > 16  # text drawn, not a blank page
    assert "i2_compile_elu.py" in page.read_text()


def test_two_values_of_one_arm_each_show_in_the_arms_table_by_name():
    """The script's own comparison of two values of one arm (`cents_torch` against `cents_py`, a
    thirty-first new user's): the arms' table showed one value, whichever side was read last —
    the script's expected numbers, in the row a reader takes for torch's output."""
    report = _elu_report()
    a = dataclasses.replace(_side("cuda", "[52, 58, 104] int64[3]"), label="`cents_torch`")
    b = dataclasses.replace(_side("cuda", "[53, 59, 105] int64[3]"), label="`cents_py`", observable=1)
    report.comparison.divergence = dataclasses.replace(report.comparison.divergence, source="claim", a=a, b=b,
                                                       observable_label="`cents_torch` vs `cents_py`")
    root = assert_renders_cleanly(render_comment(report_json(report))).root
    rows = _table(root, "arm", "status")
    cuda = next(row for row in rows[1:] if row[0].text().replace(ZWSP, "") == "cuda")
    shown = cuda[2].text().replace(ZWSP, "")
    assert "cents_torch [52, 58, 104] int64[3]" in shown and "cents_py [53, 59, 105] int64[3]" in shown, shown
    assert shown.index("cents_torch") < shown.index("cents_py")
