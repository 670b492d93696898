"""Extraction from GitHub issue bodies: the PyTorch bug-report form and the ways real bodies
deviate from it, plus a property test that arbitrary markdown never makes it raise."""
import ast
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.extract import extract_issue_body, parse_environment
from tests.conftest import FIXTURES

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
                     "https://gist.github.com/a/b\n", "\r\n", "\x00", "    ```python\n", "``` `bad` info\n"]),
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
