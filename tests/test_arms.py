import pytest

from triage.arms.spec import ArmSpecError, default_arms, parse_arms


def test_parses_devices_modes_backends_and_knobs():
    arms = parse_arms("cpu, cuda:1, cpu/compile, cuda/compile=aot_eager, cuda/tf32=off, cpu/threads=1")
    assert [a.spec for a in arms] == ["cpu", "cuda:1", "cpu/compile", "cuda/compile=aot_eager",
                                      "cuda/tf32=off", "cpu/threads=1"]
    assert arms[3].mode == "compile" and arms[3].backend == "aot_eager"
    assert dict(arms[5].knobs) == {"threads": "1"}
    assert arms[0].to_job() == {"spec": "cpu", "device": "cpu", "mode": "eager", "backend": None, "knobs": {}}


@pytest.mark.parametrize("text, names", [
    ("gpu", "'gpu'"), ("cpu/compile=tensorrt", "'tensorrt'"), ("cpu/warp=9", "'warp'"),
    ("cpu/threads=0", "threads"), ("cpu/tf32=maybe", "'maybe'"), ("cpu/tf32", "needs a value"),
    ("cpu,cpu", "twice"), ("", "empty"), ("cpu/fallback_random=on", "compile arms only"),
])
def test_bad_specs_name_the_bad_part(text, names):
    with pytest.raises(ArmSpecError, match=names):
        parse_arms(text)


def test_fault_arms_need_the_test_switch(monkeypatch):
    monkeypatch.delenv("TRIAGE_TEST_ARMS", raising=False)
    with pytest.raises(ArmSpecError, match="triage's own tests"):
        parse_arms("cpu/fault=aten.mm")
    monkeypatch.setenv("TRIAGE_TEST_ARMS", "1")
    assert dict(parse_arms("cpu/fault=aten.mm:nan")[0].knobs) == {"fault": "aten.mm:nan"}


def test_default_arms_follow_what_the_script_compares(monkeypatch):
    monkeypatch.setattr("triage.arms.spec.cuda_present", lambda: False)
    arms, notes = default_arms("import torch\nprint(torch.ones(3).sum())\n")
    assert [a.spec for a in arms] == ["cpu"] and not any("CUDA" in n for n in notes)
    compiled = "import torch\nf = torch.compile(lambda x: x + 1, backend=my_backend)\n"
    arms, notes = default_arms(compiled)
    assert [a.spec for a in arms] == ["cpu", "cpu/compile"] and "own backend" in notes[0]
    arms, _ = default_arms("from torch import compile as c\n@c\ndef f(x):\n    return x\n")
    assert [a.spec for a in arms] == ["cpu", "cpu/compile"]
    arms, notes = default_arms("import torch\nx = torch.ones(3).cuda()\n")
    assert [a.spec for a in arms] == ["cpu"] and "no CUDA device" in notes[0] and "--arms cpu,cuda" in notes[0]
    monkeypatch.setattr("triage.arms.spec.cuda_present", lambda: True)
    assert [a.spec for a in default_arms("x = 1\n")[0]] == ["cpu", "cuda"]
    arms, _ = default_arms("import torch\nm = torch.compile(model).cuda()\n")
    assert [a.spec for a in arms] == ["cuda", "cuda/compile"]
