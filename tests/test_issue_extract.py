"""Extraction from GitHub issue bodies: the PyTorch bug-report form and the ways real bodies
deviate from it, CommonMark block structure (blockquotes, list items, indented code), plus a
property test that arbitrary markdown never makes it raise and hostile markdown stays linear."""
import ast
import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES
from triage.extract import MAX_BODY_CHARS, MAX_MARKDOWN_NESTING, extract_issue_body, parse_environment

ISSUES = FIXTURES / "issues"


def test_bug_report_form():
    r = extract_issue_body((ISSUES / "logdet_form.md").read_text())
    assert r.problem is None
    assert r.script.rstrip() == (FIXTURES / "singular_logdet.py").read_text().rstrip()
    assert r.observed == ["CPU logdet: -inf\nGPU logdet: -108.34196472167969"]
    assert r.environment_fields["PyTorch version"] == "2.1.0+cu121"
    assert r.environment_fields["GPU models and configuration"] == "GPU 0: NVIDIA A100-SXM4-40GB"


def test_event_payload_body_is_the_same_extraction():
    event = json.loads((ISSUES / "logdet_event.json").read_text())
    assert extract_issue_body(event["issue"]["body"]).script == \
        extract_issue_body((ISSUES / "logdet_form.md").read_text()).script


def test_transcript_prompts_are_stripped_and_outputs_kept():
    r = extract_issue_body((ISSUES / "transcript.md").read_text())
    assert r.problem is None
    assert r.script.splitlines() == ["import torch", "x = torch.tensor([1e38, 3.0e38, 2e37, 2.0])",
                                     "torch.acosh(x)", "torch.compile(torch.acosh)(x)"]
    assert "tensor([inf, inf, inf, 1.3170])" in r.observed[0]


def test_blocks_that_build_on_each_other_are_joined():
    r = extract_issue_body((ISSUES / "two_blocks.md").read_text())
    assert r.problem is None
    assert "x = torch.randn(64, 64)" in r.script and "torch.compile" in r.script
    assert any("joined" in n for n in r.notes)
    assert r.environment is None  # "_No response_"


def test_unrelated_blocks_take_the_largest_that_imports_torch():
    body = "```python\nimport torch\nx = torch.ones(3)\nprint(x.sum())\n```\n\n```python\nimport os\nprint(os.sep)\n```\n"
    r = extract_issue_body(body)
    assert r.script.startswith("import torch") and "os.sep" not in r.script
    assert any("block 1 of 2" in n for n in r.notes)


def test_link_only_is_a_clear_no_repro():
    r = extract_issue_body((ISSUES / "gist_only.md").read_text())
    assert r.script is None and "gist.github.com" in r.problem and "does not fetch" in r.problem
    assert r.environment_fields == {"PyTorch version": "2.3.0", "OS": "macOS 14"}


def test_untagged_fences_are_classified():
    body = ("```\nimport torch\nprint(torch.ones(2).logdet())\n```\n"
            "```\nTraceback (most recent call last):\n  File \"x.py\", line 2\nRuntimeError: bad\n```\n"
            "```\ntensor([1., inf])\n```\n")
    r = extract_issue_body(body)
    assert r.script.startswith("import torch")
    assert r.traceback.endswith("RuntimeError: bad")
    assert r.observed == ["tensor([1., inf])"]


def test_unfenced_script():
    r = extract_issue_body("import torch\nx = torch.ones(3)\nprint(x.logsumexp(0))\n")
    assert r.problem is None and "logsumexp" in r.script


def test_missing_imports_are_added_and_said():
    r = extract_issue_body("```python\nx = torch.ones(3)\ny = np.asarray(x)\n```")
    assert r.script.splitlines()[:2] == ["import torch", "import numpy as np"]
    assert any("import numpy as np" in n for n in r.notes)


def test_external_data_file_is_named():
    r = extract_issue_body("```python\nimport torch\nw = torch.load('weights.pt')\nprint(w.sum())\n```")
    assert "weights.pt" in r.problem


def test_saved_then_loaded_file_is_not_external():
    r = extract_issue_body("```python\nimport torch\ntorch.save(torch.ones(2), 'w.pt')\nprint(torch.load('w.pt'))\n```")
    assert r.problem is None


def test_no_code_and_no_torch():
    assert "no Python code" in extract_issue_body("### Describe the bug\n\nIt is wrong.\n").problem
    assert "does not use torch" in extract_issue_body("```python\nprint(1 + 1)\n```").problem
    assert extract_issue_body("").problem == "the issue body is empty"
    assert extract_issue_body(None).problem == "the issue body is empty"


def test_broken_python_block_still_goes_to_the_run_to_name_the_error():
    r = extract_issue_body("```python\nimport torch\nx = torch.ones(3\n```")
    assert r.problem is None and "does not parse" in r.notes[0]


def test_code_under_versions_is_not_the_script():
    body = "### Versions\n\n```python\nimport torch\nprint(torch.__version__)\n```\n"
    assert extract_issue_body(body).script is None


def test_environment_fields():
    assert parse_environment("PyTorch version: 2.1.0\nnoise: x\nOS: Linux\n") == {"PyTorch version": "2.1.0", "OS": "Linux"}


def test_hostile_body_is_only_data():
    body = ("### 🐛 Describe the bug\n\n```python\nimport torch\nprint('$(rm -rf /)', '${{ secrets.GITHUB_TOKEN }}')\n```\n"
            "<script>alert(1)</script>\n" + "A" * (1 << 20))
    r = extract_issue_body(body)
    assert r.script is None and "characters" in r.problem
    r = extract_issue_body(body[:5000])
    assert "${{ secrets.GITHUB_TOKEN }}" in r.script  # kept verbatim: it is data, never interpolated


_markdown_piece = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["### 🐛 Describe the bug\n", "### Versions\n", "_No response_\n", "```python\n", "```\n",
                     "~~~\n", "````py\n", ">>> import torch\n", "... \n", "In [1]: x = 1\n", "Out[1]: 1\n",
                     "Traceback (most recent call last):\n", "ValueError: x\n", "PyTorch version: 2.1\n",
                     "import torch\n", "torch.load('a.pt')\n", "x = (((((\n", "1+" * 3000 + "1\n",
                     "https://gist.github.com/a/b\n", "\r\n", "\x00", "    ```python\n", "``` `bad` info\n",
                     # markdown structure: containers, indented code, other fences and headings
                     "> ```python\n", "> ", ">" * 30 + " ", "> >>> x = 1\n", ">>> # comment\n", "1. ", "- ",
                     "   ```python\n", "   ```\n", "    import torch\n", "\t```\n", "````\n", "~~~~python\n",
                     "<details><summary>x</summary>\n", "</details>\n", "Versions\n--------\n", "# c\n", "\n"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_markdown_piece, max_size=25).map("".join))
def test_never_raises_on_arbitrary_markdown(body):
    r = extract_issue_body(body)
    if r.script is None:
        assert r.problem  # no script always comes with a reason
    if r.problem is None:
        assert "torch" in r.script
    for text in r.observed:
        assert isinstance(text, str)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=400))
def test_a_fenced_valid_script_round_trips(code):
    script = f"import torch\nx = {code!r}\n"
    ast.parse(script)
    r = extract_issue_body(f"### 🐛 Describe the bug\n\n```python\n{script}```\n")
    assert r.script == script.rstrip("\n") and r.problem is None


# == CommonMark block structure ===============================================================

SCRIPT = "import torch\nx = torch.ones(3)\nprint(x.logsumexp(0))"


def test_fenced_repro_inside_a_blockquote_is_the_script():
    quoted = "\n".join("> " + line for line in f"### 🐛 Describe the bug\n```python\n{SCRIPT}\n```\nIt prints inf.".split("\n"))
    r = extract_issue_body("Same as on the forum:\n\n" + quoted + "\n\nAny idea?\n")
    assert r.problem is None and r.script == SCRIPT and r.notes == []


def test_unclosed_fence_in_a_blockquote_ends_with_the_blockquote():
    r = extract_issue_body(f"> ```python\n> {SCRIPT.replace(chr(10), chr(10) + '> ')}\n\n```\ntensor(inf)\n```\n")
    assert r.script == SCRIPT and r.observed == ["tensor(inf)"]


def test_indented_code_block_repro_is_found():
    indented = "\n".join("    " + line for line in SCRIPT.split("\n"))
    r = extract_issue_body(f"### 🐛 Describe the bug\n\nRepro:\n\n{indented}\n\nIt prints inf.\n")
    assert r.problem is None and r.script == SCRIPT


def test_indented_traceback_and_output_are_classified():
    r = extract_issue_body(f"```python\n{SCRIPT}\n```\n\nGives:\n\n    Traceback (most recent call last):\n"
                           "      File \"x.py\", line 3\n    RuntimeError: bad\n\nor sometimes\n\n    tensor(inf)\n")
    assert r.script == SCRIPT
    assert r.traceback == 'Traceback (most recent call last):\n  File "x.py", line 3\nRuntimeError: bad'
    assert r.observed == ["tensor(inf)"]


def test_four_space_indented_backticks_are_an_indented_code_block_not_a_fence():
    indented = "\n".join("    " + line for line in f"```python\n{SCRIPT}\n```".split("\n"))
    r = extract_issue_body(f"Repro:\n\n{indented}\n")
    # The backticks are part of the code (as GitHub shows them): not a python fence.
    assert r.script is None and "no Python code" in r.problem
    assert r.observed == [f"```python\n{SCRIPT}\n```"]
    # ... and such a block does not hide a real fence after it.
    r = extract_issue_body(f"Repro:\n\n{indented}\n\nFixed:\n\n```python\n{SCRIPT}\n```\n")
    assert r.script == SCRIPT


def test_fence_in_a_list_item_loses_the_item_indentation():
    code = "import torch\ndef f(x):\n    return x.logsumexp(0)\nprint(f(torch.ones(3)))"
    item = "\n".join(("   " + line).rstrip() for line in f"```python\n{code}\n```".split("\n"))
    r = extract_issue_body(f"### To Reproduce\n\n1. Run this:\n\n{item}\n2. Compare with NumPy.\n")
    assert r.problem is None and r.script == code
    # No blank line before the fence, a `-` item, and a list inside a blockquote.
    nested = "\n".join(("> - " if i == 0 else ">   ") + line for i, line in enumerate(f"Run:\n```py\n{code}\n```".split("\n")))
    for body in (f"1. Run this:\n{item}\n", nested):
        assert extract_issue_body(body).script == code, body


def test_tilde_and_longer_fences_and_an_unclosed_fence():
    assert extract_issue_body(f"~~~python\n{SCRIPT}\n~~~\nprints inf\n").script == SCRIPT
    inner = "import torch\ndoc = \"\"\"\n```python\nprint(1)\n```\n\"\"\"\nprint(torch.ones(2).sum(), doc)"
    assert extract_issue_body(f"````python\n{inner}\n````\n").script == inner
    assert extract_issue_body(f"~~~~\n{inner}\n~~~~\n").script == inner
    # An unclosed fence runs to the end of the body (CommonMark).
    r = extract_issue_body(f"### 🐛 Describe the bug\n\n```python\n{SCRIPT}\n\nprint('after a blank line')\n")
    assert r.script == SCRIPT + "\n\nprint('after a blank line')"


def test_fence_right_after_details_tags_is_found():
    r = extract_issue_body(f"<details><summary>repro</summary>\n```python\n{SCRIPT}\n```\n</details>\n")
    assert r.script == SCRIPT


def test_heading_inside_a_blockquote_holds_only_inside_it():
    r = extract_issue_body(f"> ### Versions\n> PyTorch version: 2.0\n\n```python\n{SCRIPT}\n```\n")
    assert r.script == SCRIPT
    setext = f"Versions\n--------\n\n```python\n{SCRIPT}\n```\n"  # a setext heading is a heading too
    assert extract_issue_body(setext).script is None


def test_unfenced_transcript_lines_are_not_markdown_structure():
    # To markdown `>>> # ...` is a heading in a blockquote; it is a comment in a session.
    body = ">>> import torch\n>>> # three ones\n>>> x = torch.ones(3)\n>>> x.logsumexp(0)\ntensor(inf)\n"
    r = extract_issue_body("Look:\n\n" + body)
    assert r.script == "import torch\n# three ones\nx = torch.ones(3)\nx.logsumexp(0)"
    assert r.observed == ["tensor(inf)"] and r.notes == ["from a `>>>` transcript (prompts stripped)"]
    # The same session in a pycon fence.
    assert extract_issue_body(f"```pycon\n{body}```\n").script == r.script


def test_unfenced_script_with_a_blank_line_in_a_function_body_stays_whole():
    # To markdown the indented lines after the blank line are an indented code block.
    script = "import torch\n\ndef f(x):\n    y = x.exp()\n\n    return y.log()\n\nprint(f(torch.ones(3)))"
    r = extract_issue_body(script + "\n")
    assert r.script == script and r.notes == ["the code is unfenced in the issue body"] and r.observed == []


def test_nul_in_a_fence_is_kept_verbatim():
    r = extract_issue_body("```python\nimport torch\nprint('a\x00b', torch.ones(1))\n```\n")
    assert r.script == "import torch\nprint('a\x00b', torch.ones(1))"


# == hostile markdown =========================================================================

def _fill(size: int, unit: str, head: str = "") -> str:
    return (head + unit * (size // len(unit) + 1))[:size]


def _cpu_seconds(body: str, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        r = extract_issue_body(body)
        best = min(best, time.process_time() - start)
        assert r.script is not None or r.problem
    return best


def test_a_megabyte_of_nesting_markers_is_read():
    for unit in (">", "> " * 40 + "x\n", "*", "* " * 40 + "x\n", "- " * 40 + "x\n", "[", "[a\n"):
        r = extract_issue_body(_fill(MAX_BODY_CHARS, unit))
        assert r.script is None and "no Python code" in r.problem, unit[:10]


def test_time_grows_linearly_with_the_body():
    # Eight times the body, eight times the CPU time, on the shapes where a parser (or
    # triage's transcript splitting) goes quadratic: lazy lines under deep nesting, a long
    # unfenced `>>>` session, `[` lines. Quadratic would be 64 times.
    shapes = {"deep blockquote": ("b\n", ">" * 40 + " a\n"), "transcript": ("b\n", ">>> a\n"), "brackets": ("[a\n", "")}
    for name, (unit, head) in shapes.items():
        small = _cpu_seconds(_fill(1 << 15, unit, head), repeat=3)
        large = _cpu_seconds(_fill(1 << 18, unit, head))
        assert large < 24 * max(small, 0.01), (name, small, large)


def test_nesting_depth_is_capped():
    # The parser's time is lines times open containers: 200 levels of blockquote cost about
    # what 6 do (a 5-level fence, in a list item in a list item in a blockquote, is found).
    shallow = _cpu_seconds(_fill(1 << 16, "b\n", ">" * 6 + " a\n"), repeat=2)
    deep = _cpu_seconds(_fill(1 << 16, "b\n", ">" * 200 + " a\n"), repeat=2)
    # Uncapped, 200 levels cost about 200/6 as much; 4x leaves room for a loaded machine
    # (the whole suite at ATEN_CPU_CAPABILITY=default once measured 2.07x).
    assert deep < 4 * shallow, (shallow, deep)
    fence = f"```python\n{SCRIPT}\n```"
    nested = "> - 1. " + "\n>      ".join(fence.split("\n"))
    assert extract_issue_body(nested).script == SCRIPT
    # Up to the cap a fence is a fence; below it, its lines are prose.
    code = f"```python\n{SCRIPT}\n```"
    assert extract_issue_body("\n".join("> > > " + line for line in code.split("\n"))).script == SCRIPT
    deep_code = "\n".join("> " * (MAX_MARKDOWN_NESTING + 1) + line for line in code.split("\n"))
    assert extract_issue_body(deep_code).script is None
