"""A forward and an inverse DFT whose `norm=` arguments do not match (triage/paths.py
`_round_trip`, triage/classify/ladder.py `_round_trip_scaled`): the round trip is n^p times its
input. A new user's `irfft(rfft(x), norm="forward")` is 1000·x for n = 1000; the value the script
expected back was x, and triage said it could not tell whether the kernels or the expectation
were wrong."""
import json
import textwrap

import pytest

from tests.conftest import run_source
from triage.arms.graph import OpGraph
from triage.paths import part_ways
from triage.report.data import validate_report


def _graph(tmp_path, forward_norm, inverse_norm, inverse="aten._fft_c2r.default"):
    x = {"name": "x", "op": "leaf", "line": 3, "dtype": "float32", "kind": "random"}
    inverse_args = ([{"node": "spectrum"}, [0], inverse_norm, 1000] if inverse.endswith("c2r.default")
                    else [{"node": "spectrum"}, [0], inverse_norm, False])
    nodes = [x,
             {"name": "spectrum", "op": "call", "target": "aten._fft_r2c.default", "line": 6, "dtype": "complex64",
              "args": [{"node": "x"}, [0], forward_norm, inverse.endswith("c2r.default")], "kwargs": {"dict": {}}},
             {"name": "y", "op": "call", "target": inverse, "line": 7, "dtype": "float32",
              "args": inverse_args, "kwargs": {"dict": {}}}]
    (tmp_path / "graph.json").write_text(json.dumps({"nodes": nodes}))
    return OpGraph(tmp_path)


@pytest.mark.parametrize("forward_norm, inverse_norm, power", [
    (0, 0, 1.0),    # rfft(norm="backward"), irfft(norm="forward"): n·x
    (0, 2, 0.0),    # both "backward" (the defaults): x
    (1, 1, 0.0),    # both "ortho": x
    (2, 2, -1.0),   # rfft(norm="forward"), irfft(norm="backward"): x/n
    (1, 2, -0.5),   # fft(norm="ortho"), ifft(norm="backward"): x/√n
])
def test_a_dft_round_trip_leaves_the_power_of_n_its_normalizations_do_not_cancel(tmp_path, forward_norm,
                                                                                inverse_norm, power):
    trip = part_ways(_graph(tmp_path, forward_norm, inverse_norm), "y", "x")["round_trip_a"]
    assert trip["power"] == power
    assert trip["forward"]["line"] == 6 and trip["inverse"]["line"] == 7
    names = ("backward", "ortho", "forward")
    assert trip["forward"]["norm"] == names[forward_norm] and trip["inverse"]["norm"] == names[2 - inverse_norm]


def test_an_fft_round_trip_with_mismatched_norms_is_the_scripts_expectation_not_the_kernels(triage, tmp_path):
    report = run_source(triage, tmp_path, "roundtrip", textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        x = torch.randn(64)
        y = torch.fft.irfft(torch.fft.rfft(x), n=64, norm="forward")
        assert torch.allclose(x, y, atol=1e-5), "irfft(rfft(x)) should return x"
    """))
    verdict = report["verdict"]
    assert verdict["kind"] == "likely-bug", verdict["summary"]
    assert "`y` is 64 × `x` in every element, n for the transform length n = 64" in verdict["summary"]
    assert 'with norm="backward" and `aten._fft_c2r.default` (line 4) with norm="forward"' in verdict["summary"]
    assert validate_report(report) == []  # the round trip is part of report.json's schema
