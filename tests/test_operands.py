"""The script's own names for compared values (triage/operands.py), where two compared values'
op graphs part (triage/paths.py), and the script's backend cut out of its source
(triage/minimize/backend_source.py): all read, never run."""
import json
import textwrap

from triage.arms.graph import OpGraph
from triage.minimize.backend_source import backend_definitions, torch_level_targets
from triage.operands import (
    as_receiver,
    assigned_readback,
    compared_expressions,
    operand_names,
    readback_name,
    spelled_on_line,
)
from triage.paths import part_ways

SOURCE = textwrap.dedent("""\
    import torch
    mine = torch.ones(3)
    theirs = torch.ones(3) * 2
    torch.testing.assert_close(mine, theirs)
    print(mine.allclose(theirs), torch.equal(mine, theirs))
    assert (mine == theirs).all()
    print(mine.sum().item())
    print("a", mine, theirs)
    torch.allclose(mine, theirs); torch.allclose(theirs, mine)
""")


def test_compared_values_are_named_by_the_scripts_expressions():
    assert operand_names(SOURCE, 4, "torch.testing.assert_close") == ("mine", "theirs")
    assert operand_names(SOURCE, 5, "Tensor.allclose") == ("mine", "theirs")
    assert operand_names(SOURCE, 5, "torch.equal") == ("mine", "theirs")
    assert operand_names(SOURCE, 6, "==") == ("mine", "theirs")
    assert readback_name(SOURCE, 7, ".item()") == "mine.sum()"


def test_a_batch_computed_whole_and_slice_by_slice_is_the_notes_batched_case(tmp_path):
    """`x @ W.T` against `torch.stack([x[i] @ W.T for i …])`: one mm over the batch, one per
    slice joined by stack, which the accuracy note's batched section covers."""
    nodes = [{"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"},
             {"name": "w", "op": "leaf", "line": 3, "dtype": "float32", "kind": "random"},
             call("full", "aten.mm.default", [{"node": "x"}, {"node": "w"}], 5)]
    rows = []
    for i in range(3):
        nodes += [call(f"row{i}", "aten.select.int", [{"node": "x"}, 0, i], 6),
                  call(f"u{i}", "aten.unsqueeze.default", [{"node": f"row{i}"}, 0], 6),
                  call(f"mm{i}", "aten.mm.default", [{"node": f"u{i}"}, {"node": "w"}], 6)]
        rows.append({"node": f"mm{i}"})
    nodes.append(call("rows", "aten.cat.default", [rows], 6))
    parted = part_ways(_graph(tmp_path, nodes), "full", "rows")
    assert "`aten.mm` over the whole batch, the other 3 times" in parted["batched"]
    # What the note makes of it: the difference it allows where the float64 values agree; where
    # they differ (a wrong `in_dims`, a missing transpose), not the cause.
    from triage.classify.wording import parting_text

    agree, differ = parting_text(parted, ("`a`", "`b`")), parting_text(parted, ("`a`", "`b`"), functions_differ=True)
    assert "says the two need not agree bitwise" in agree and "not its float64 value, which differs here" not in agree
    assert "need not agree bitwise" not in differ and "not its float64 value, which differs here" in differ
    # The same ops on both sides but for a constant: not the batched case.
    plain = part_ways(_graph(tmp_path, nodes[:3] + [call("twice", "aten.mul.Tensor", [{"node": "full"}, 2.0], 7)]),
                      "full", "twice")
    assert not plain["batched"]



def test_a_fused_kernel_on_the_batch_against_a_composite_path_per_slice_is_the_batched_case(tmp_path):
    """A module's fast path on the whole batch (one fused op) against its composite path on
    each sample (other ops, the same ones per slice), stacked: the note's batched section,
    whose "internal implementations" clause covers another kernel per slice. Per-slice work
    that does not repeat evenly is not that case."""
    nodes = [{"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"},
             {"name": "w", "op": "leaf", "line": 3, "dtype": "float32", "kind": "random"},
             call("fused", "aten._native_multi_head_attention.default", [{"node": "x"}, {"node": "w"}], 5)]
    rows = []
    for i in range(4):
        nodes += [call(f"row{i}", "aten.select.int", [{"node": "x"}, 0, i], 6),
                  call(f"proj{i}", "aten.addmm.default", [{"node": "w"}, {"node": f"row{i}"}, {"node": "w"}], 6),
                  call(f"att{i}", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                       [{"node": f"proj{i}"}, {"node": f"proj{i}"}, {"node": f"proj{i}"}], 6)]
        rows.append({"node": f"att{i}"})
    parted = part_ways(_graph(tmp_path, nodes + [call("rows", "aten.stack.default", [rows], 6)]), "fused", "rows")
    assert ("`aten._native_multi_head_attention` over the whole batch, the other 2 ops per slice (`aten.addmm`, "
            "`aten._scaled_dot_product_flash_attention_for_cpu`) for each of 4 slices" in parted["batched"])
    # A fifth projection in one slice only: the slices are not one implementation repeated.
    uneven = nodes + [call("extra", "aten.addmm.default", [{"node": "w"}, {"node": "att0"}, {"node": "w"}], 6),
                      call("rows", "aten.stack.default", [[{"node": "extra"}] + rows[1:]], 6)]
    assert not part_ways(_graph(tmp_path, uneven), "fused", "rows")["batched"]

def test_an_ambiguous_line_names_nothing():
    assert operand_names(SOURCE, 9, "torch.allclose") is None  # two calls, other orders
    assert readback_name(SOURCE, 8, "print/repr") is None  # two tensors printed at once
    # The index a printed slice is taken at is not a second printed value.
    indexed = 'i = 3\nprint("sample", i, "fp32 logits:", logits32[i], 2.5)\nprint(i, logits32[i], logits16[i])\n'
    assert readback_name(indexed, 2, "print/repr") == "logits32[i]"
    assert readback_name(indexed, 3, "print/repr") is None
    assert operand_names("this is not python(", 1, "torch.equal") is None


def _graph(tmp_path, nodes):
    (tmp_path / "graph.json").write_text(json.dumps({"nodes": nodes}))
    return OpGraph(tmp_path)


def call(name, target, args, line, **kwargs):
    return {"name": name, "op": "call", "target": target, "args": args, "kwargs": {"dict": kwargs},
            "line": line, "dtype": "float32"}


def test_two_paths_part_where_their_ops_have_no_counterpart(tmp_path):
    x = {"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}
    graph = _graph(tmp_path, [
        x,
        call("mean", "aten.mean.dim", [{"node": "x"}, [-1], True], 7),
        call("centred_a", "aten.sub.Tensor", [{"node": "x"}, {"node": "mean"}], 9),
        call("var", "aten.var.correction", [{"node": "x"}, [-1]], 8, correction=1, keepdim=True),
        call("norm_a", "aten.div.Tensor", [{"node": "centred_a"}, {"node": "var"}], 9),
        call("mean_b", "aten.mean.dim", [{"node": "x"}, [-1], True], 12),
        call("centred_b", "aten.sub.Tensor", [{"node": "x"}, {"node": "mean_b"}], 12),
        call("var_b", "aten.var.correction", [{"node": "x"}, [-1]], 13, correction=0, keepdim=True),
        call("norm_b", "aten.div.Tensor", [{"node": "centred_b"}, {"node": "var_b"}], 13),
    ])
    parted = part_ways(graph, "norm_a", "norm_b")
    # The mean and the centring are the same computation on both sides: not listed.
    assert [o["op"] for o in parted["only_a"]] == ["aten.var.correction", "aten.div.Tensor"]
    assert [o["line"] for o in parted["only_b"]] == [13, 13]
    assert not parted["constant_a"] and not parted["constant_b"]
    assert any("the constant 1 at line 8 where the other side has 0" in h for h in parted["hints"])
    assert any("unbiased estimate" in h for h in parted["hints"])


def test_one_formula_but_for_a_constant_is_named_whichever_op_spells_it(tmp_path):
    # A new user's normal CDF: `0.5 * (1 + erf(x / 1.4142))` against `torch.special.ndtr`'s
    # decomposition `0.5 * (1 + erf(x * 0.7071067811865476))`: a quotient by 1.4142 is a product
    # by 0.707114, and 1/√2 is 0.7071067811865476; the other steps are the same on both sides.
    x = {"name": "x", "op": "leaf", "line": 3, "dtype": "float32", "kind": "factory"}
    graph = _graph(tmp_path, [
        x,
        call("scaled_a", "aten.div.Tensor", [{"node": "x"}, 1.4142], 5),
        call("erf_a", "aten.erf.default", [{"node": "scaled_a"}], 5),
        call("one_a", "aten.add.Tensor", [{"node": "erf_a"}, 1], 5),
        call("mine", "aten.mul.Tensor", [{"node": "one_a"}, 0.5], 5),
        call("scaled_b", "aten.mul.Scalar", [{"node": "x"}, 0.7071067811865476], 6),
        call("erf_b", "aten.erf.default", [{"node": "scaled_b"}], 6),
        call("one_b", "aten.add.Scalar", [{"node": "erf_b"}, 1], 6),
        call("ref", "aten.mul.Scalar", [{"node": "one_b"}, 0.5], 6),
    ])
    hints = part_ways(graph, "mine", "ref")["hints"]
    assert hints[0] == ("`aten.div.Tensor` divides by 1.4142 at line 5 where `aten.mul.Scalar` multiplies by "
                        "0.7071067811865476 (1/√2) at line 6: one formula but for this constant, relatively "
                        "9.6e-06 apart")
    assert len(hints) == 1  # the shift by 1 and the product by 0.5 are the same on both sides
    graph = _graph(tmp_path, [x, call("mine", "aten.sub.Tensor", [{"node": "x"}, 2.0], 5),
                              call("ref", "aten.add.Tensor", [{"node": "x"}, -2.0], 6)])
    assert part_ways(graph, "mine", "ref") is None or not part_ways(graph, "mine", "ref")["hints"]


def test_an_in_place_shift_is_a_shift_and_dims_that_may_be_one_are_not_called_apart(tmp_path):
    """A hand-written RMSNorm with eps 1e-5 against `F.rms_norm`'s `add_` of 1e-6 (held in float32:
    9.999999974752427e-07): one formula but for the constant, said as written; its `mean` over
    dim -1 against the decomposition's dim 2 of the same 3-d value is no difference."""
    x = {"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}
    graph = _graph(tmp_path, [
        x,
        call("ms_a", "aten.mean.dim", [{"node": "x"}, [-1], True], 13),
        call("eps_a", "aten.add.Tensor", [{"node": "ms_a"}, 1e-05], 14),
        call("ours", "aten.rsqrt.default", [{"node": "eps_a"}], 14),
        call("ms_b", "aten.mean.dim", [{"node": "x"}, [2], True], 18),
        call("eps_b", "aten.add_.Scalar", [{"node": "ms_b"}, 9.999999974752427e-07], 18),
        call("ref", "aten.rsqrt.default", [{"node": "eps_b"}], 18),
    ])
    assert part_ways(graph, "ours", "ref")["hints"] == [
        "`aten.add.Tensor` adds 1e-05 at line 14 where `aten.add_.Scalar` adds 1e-06 at line 18: one formula but "
        "for this constant, relatively 0.9 apart"]


def test_two_chains_one_step_apart_name_the_step(tmp_path):
    """An eps added before `sqrt` on one side and after it on the other; a `/ beta` one side
    leaves out; a bias added on one side only: each named as the one step that parts them."""
    x = {"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}
    graph = _graph(tmp_path, [
        x,
        call("var", "aten.var.correction", [{"node": "x"}, [-1]], 3, correction=0, keepdim=True),
        call("centred", "aten.sub.Tensor", [{"node": "x"}, {"node": "var"}], 3),
        call("eps_a", "aten.add.Tensor", [{"node": "var"}, 1e-05], 5),
        call("std_a", "aten.sqrt.default", [{"node": "eps_a"}], 5),
        call("norm_a", "aten.div.Tensor", [{"node": "centred"}, {"node": "std_a"}], 5),
        call("std_b", "aten.sqrt.default", [{"node": "var"}], 9),
        call("eps_b", "aten.add.Tensor", [{"node": "std_b"}, 1e-05], 9),
        call("norm_b", "aten.div.Tensor", [{"node": "centred"}, {"node": "eps_b"}], 9),
    ])
    assert part_ways(graph, "norm_a", "norm_b")["hints"] == [
        "The same steps in another order: one side `aten.add.Tensor` adds 1e-05 then `aten.sqrt.default` (line 5), "
        "the other `aten.sqrt.default` then `aten.add.Tensor` adds 1e-05 (line 9)"]

    beta = [
        x,
        call("scaled", "aten.mul.Tensor", [{"node": "x"}, 2.0], 4),
        call("exp", "aten.exp.default", [{"node": "scaled"}], 4),
        call("soft", "aten.log1p.default", [{"node": "exp"}], 4),
        call("mine", "aten.div.Tensor", [{"node": "soft"}, 2.0], 6),
    ]
    assert part_ways(_graph(tmp_path, beta), "mine", "soft")["hints"] == [
        "`aten.div.Tensor` divides by 2.0 at line 6 is a step the other side does not take; otherwise both sides "
        "take the same steps in the same order"]

    w, b1, b2, y = ({"name": n, "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}
                    for n in ("w", "b1", "b2", "y"))
    bias = [x, w, b1, b2, y,
            call("h", "aten.mm.default", [{"node": "x"}, {"node": "w"}], 4),
            call("ih", "aten.add.Tensor", [{"node": "h"}, {"node": "b1"}], 4),
            call("hh", "aten.add.Tensor", [{"node": "ih"}, {"node": "b2"}], 5),
            call("gate_a", "aten.tanh.default", [{"node": "hh"}], 5),
            call("gate_b", "aten.tanh.default", [{"node": "ih"}], 8)]
    assert part_ways(_graph(tmp_path, bias), "gate_a", "gate_b")["hints"] == [
        "`aten.add.Tensor` at line 5 is a step the other side does not take; otherwise both sides take the same "
        "steps in the same order"]
    # Not one step apart: the extra step reads another input than the shorter side's (a
    # square root of x plus one against y plus one), or the steps are not one chain.
    other_input = [x, y, call("root", "aten.sqrt.default", [{"node": "x"}], 4),
                   call("a", "aten.add.Tensor", [{"node": "root"}, 1.0], 4),
                   call("b", "aten.add.Tensor", [{"node": "y"}, 1.0], 5)]
    assert part_ways(_graph(tmp_path, other_input), "a", "b")["hints"] == []
    branches = [x, call("e", "aten.exp.default", [{"node": "x"}], 4), call("s", "aten.sin.default", [{"node": "x"}], 4),
                call("a", "aten.add.Tensor", [{"node": "e"}, {"node": "s"}], 4),
                call("b", "aten.exp.default", [{"node": "x"}], 6)]
    assert part_ways(_graph(tmp_path, branches), "a", "b")["hints"] == []


def test_the_same_ops_at_two_precisions_are_named_as_such(tmp_path):
    """`f(x)` against `f(x.double()).float()`: the same steps in the same order, one side's in
    float32, the other's in float64 (a new user's float32 log-likelihood against its float64
    reference was "one value computed by different operations")."""
    x = {"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}

    def side(suffix, dtype, line):
        nodes = [call(f"log{suffix}", "aten.log.default", [{"node": f"x{suffix}"}], line),
                 call(f"out{suffix}", "aten.mul.Tensor", [{"node": f"log{suffix}"}, 3.0], line)]
        for n in nodes:
            n["dtype"] = dtype
        return nodes

    wide = call("x64", "aten._to_copy.default", [{"node": "x"}], 5, dtype="torch.float64")
    wide["dtype"] = "float64"
    narrow = call("back", "aten._to_copy.default", [{"node": "out64"}], 5, dtype="torch.float32")
    plain = call("x32", "aten.alias.default", [{"node": "x"}], 4)
    graph = _graph(tmp_path, [x, plain, *side("32", "float32", 4), wide, *side("64", "float64", 5), narrow])
    assert part_ways(graph, "out32", "back")["precisions"] == {"a": "float32", "b": "float64"}
    # Another constant on one side: not the same steps.
    other = side("64", "float64", 5)
    other[1]["args"][1] = 2.0
    graph = _graph(tmp_path, [x, plain, *side("32", "float32", 4), wide, *other, narrow])
    assert part_ways(graph, "out32", "back")["precisions"] is None
    # An op with several outputs (`topk`'s values and indices) is at its floating output's dtype.
    half = call("x16", "aten._to_copy.default", [{"node": "x"}], 8, dtype="torch.float16")
    half["dtype"] = "float16"
    nodes = [x, half]
    for suffix, dtype, line in (("32", "float32", 7), ("16", "float16", 8)):
        source = "x" if suffix == "32" else "x16"
        top = call(f"top{suffix}", "aten.topk.default", [{"node": source}, 10], line)
        top["dtype"] = None
        nodes += [top, {"name": f"val{suffix}", "op": "getitem", "of": f"top{suffix}", "index": 0, "line": line,
                        "dtype": dtype},
                  {"name": f"idx{suffix}", "op": "getitem", "of": f"top{suffix}", "index": 1, "line": line,
                   "dtype": "int64"}]
    assert part_ways(_graph(tmp_path, nodes), "idx32", "idx16")["precisions"] == {"a": "float32", "b": "float16"}
    # A mask the steps make along the way (quantile's `isnan`) is a bool on both sides: still
    # one floating dtype per side (a new user's float32 quantile against its float64 one).
    masked = []
    for suffix, dtype, line in (("32", "float32", 4), ("64", "float64", 5)):
        nodes = side(suffix, dtype, line)
        nan = call(f"nan{suffix}", "aten.isnan.default", [{"node": f"log{suffix}"}], line)
        nan["dtype"] = "bool"
        nodes[1]["args"][1] = {"node": f"nan{suffix}"}  # the product reads the mask
        masked += [nodes[0], nan, nodes[1]]
    graph = _graph(tmp_path, [x, plain, wide, *masked, narrow])
    assert part_ways(graph, "out32", "back")["precisions"] == {"a": "float32", "b": "float64"}
    # Steps at two dtypes on one side, each at most as precise as the other side's (a bfloat16
    # `cumsum` divided by float32 counts, against the same in float64: a thirtieth new user's
    # running mean was "one value computed by different operations"): its least precise.
    mixed = side("32", "float32", 4)
    mixed[0]["dtype"] = "bfloat16"
    graph = _graph(tmp_path, [x, plain, *mixed, wide, *side("64", "float64", 5), narrow])
    assert part_ways(graph, "out32", "back")["precisions"] == {"a": "bfloat16", "b": "float64"}
    # Not where the sides' order turns between steps.
    crossed = side("64", "float64", 5)
    crossed[1]["dtype"] = "float16"
    graph = _graph(tmp_path, [x, plain, *side("32", "float32", 4), wide, *crossed, narrow])
    assert part_ways(graph, "out32", "back")["precisions"] is None


def test_a_hand_written_backward_that_runs_parting_ops_is_named(tmp_path):
    """A custom `autograd.Function` whose backward differentiates another function: its ops
    come after the forward's in execution order (and out of the listed few), so the hint
    names the backward and the lines it ran; without the source, or where the backward ran
    nothing that parts, nothing is said."""
    source = textwrap.dedent("""\
        import torch
        from torch.autograd import Function
        class Softplus(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return torch.log1p(torch.exp(x))
            @staticmethod
            def backward(ctx, grad):
                return grad * torch.sigmoid(-ctx.saved_tensors[0])
        class Plain(Function):
            @staticmethod
            def backward(ctx, grad):
                return grad
        """)
    graph = _graph(tmp_path, [
        {"name": "x", "op": "leaf", "line": 14, "dtype": "float32"},
        call("e", "aten.exp.default", [{"node": "x"}], 6),
        call("neg", "aten.neg.default", [{"node": "x"}], 9),
        call("sig", "aten.sigmoid.default", [{"node": "neg"}], 9),
        call("grad_a", "aten.mul.Tensor", [{"node": "sig"}, {"node": "e"}], 9),
        call("s", "aten.sigmoid.default", [{"node": "x"}], 20),
        call("grad_b", "aten.mul.Tensor", [{"node": "s"}, {"node": "x"}], 20),
    ])
    hints = part_ways(graph, "grad_a", "grad_b", source)["hints"]
    assert any("`Softplus.backward` (lines 8–9)" in h and "at line 9" in h for h in hints), hints
    assert not any("backward" in h for h in part_ways(graph, "grad_a", "grad_b")["hints"])
    from triage.paths import custom_backwards
    assert custom_backwards(source) == [("Softplus", 8, 9), ("Plain", 12, 13)]
    assert custom_backwards("not python(") == []


def test_one_computation_reached_twice_does_not_part(tmp_path):
    graph = _graph(tmp_path, [
        {"name": "x", "op": "leaf", "line": 1, "dtype": "float32"},
        call("a", "aten.exp.default", [{"node": "x"}], 2),
        call("b", "aten.exp.default", [{"node": "x"}], 3),
    ])
    assert part_ways(graph, "a", "b") is None


def test_the_backend_is_cut_out_with_what_it_needs():
    source = textwrap.dedent("""\
        import torch
        SCALE = 2.0
        def helper(node):
            return node.target is torch.expm1
        def unrelated():
            raise SystemExit
        def my_backend(gm, example_inputs):
            for node in gm.graph.nodes:
                if helper(node):
                    node.args = (node.args[0] * SCALE,)
            return gm.forward
        x = torch.ones(3)
        torch.compile(lambda t: t.expm1(), backend=my_backend)(x)
    """)
    text = backend_definitions(source, "my_backend")
    assert text.splitlines()[0] == "import torch"
    assert "SCALE = 2.0" in text and "def helper(node):" in text and "def my_backend" in text
    assert "unrelated" not in text and "torch.compile" not in text and "x = torch.ones" not in text
    namespace = {}
    exec(compile(text, "<definitions>", "exec"), namespace)
    assert callable(namespace["my_backend"])
    assert backend_definitions(source, "missing") is None and backend_definitions(source, "SCALE") is None


def test_a_backends_torch_level_targets_are_listed_and_aten_level_ones_are_not():
    definitions = textwrap.dedent("""\
        import operator
        import torch
        import torch.nn.functional as F
        aten = torch.ops.aten
        def backend(gm, example_inputs):
            for node in gm.graph.nodes:
                if node.target is F.gelu or node.target in (torch.log1p, operator.add):
                    pass
                if node.target == torch.ops.aten.relu.default or node.target is aten.tanh.default:
                    pass
                if node.target == "call_function" or node.op == F.silu:
                    pass
            return gm.forward
    """)
    assert torch_level_targets(definitions) == ["F.gelu", "torch.log1p", "operator.add"]
    assert torch_level_targets("def broken(:") == []


def test_a_workers_spelling_of_a_readback_is_taken_only_as_the_source_has_it():
    source = "import torch\nprint(a.item(), b.item())\n"
    assert spelled_on_line(source, 2, "b.item()") == "b.item()"
    assert spelled_on_line(source, 2, "c.item()") is None  # not on that line: a forged word
    assert spelled_on_line(source, 1, "b.item()") is None
    assert spelled_on_line(source + "print(`x`.item())\n", 3, "`x`.item()") is None  # would end a code span
    assert spelled_on_line(source, 2, None) is None


def test_a_lines_python_comparisons_are_read_with_their_two_sides():
    source = "x = 1\nprint(a.item() == b.item(), c < d(1), e == f == g)\n"
    assert compared_expressions(source, 2) == [("a.item()", "b.item()", "=="), ("c", "d(1)", "<")]
    assert compared_expressions(source, 1) == [] and compared_expressions("(", 1) == []


def test_the_same_ops_on_a_copy_in_another_memory_format_name_the_layout(tmp_path):
    """A new user's conv2d on a channels_last input against the contiguous one: "where they
    part" listed `aten.convolution` on both sides "with no counterpart", the copy that made
    them differ (a bookkeeping op) left out. The same step with other constants is no layout."""
    x = {"name": "x", "op": "leaf", "line": 7, "dtype": "float32", "kind": "random"}
    w = {"name": "w", "op": "leaf", "line": 6, "dtype": "float32", "kind": "input"}
    conv = [{"node": "w"}, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]
    graph = _graph(tmp_path, [
        x, w,
        call("y", "aten.convolution.default", [{"node": "x"}] + conv, 10),
        call("x_cl", "aten._to_copy.default", [{"node": "x"}], 12, memory_format={"memory_format": "channels_last"}),
        call("y_cl", "aten.convolution.default", [{"node": "x_cl"}] + conv, 12),
        call("y_s", "aten.convolution.default", [{"node": "x_cl"}, {"node": "w"}, None, [2, 2], [1, 1], [1, 1], False,
                                                 [0, 0], 1], 13),
    ])
    hints = part_ways(graph, "y", "y_cl")["hints"]
    assert ("Both sides run the same ops (`aten.convolution.default`), but one side's inputs come through a copy into "
            "torch.channels_last memory format (`aten._to_copy.default` at line 12)") in hints[-1], hints
    assert not any("memory format" in h for h in part_ways(graph, "y", "y_s")["hints"])


def test_a_side_that_starts_from_what_the_other_left_is_found(tmp_path):
    """`paths.carried_state`: the second of two compared values computed from the first (a
    training step between two calls of a model), or from a tensor the same in-place code wrote
    for each side (a function that writes its argument, called twice on one tensor)."""
    from triage.paths import carried_state

    leaf = {"name": "x", "op": "leaf", "line": 3, "dtype": "float32", "kind": "random"}
    w = {"name": "w", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"}
    # y1 = x @ w; w -= 0.1 * (y1 summed); y2 = x @ w
    step = [call("y1", "aten.mm.default", [{"node": "x"}, {"node": "w"}], 5),
            call("g", "aten.sum.default", [{"node": "y1"}], 6),
            call("upd", "aten.sub_.Tensor", [{"node": "w"}, {"node": "g"}], 7),
            call("y2", "aten.mm.default", [{"node": "x"}, {"node": "upd"}], 9)]
    graph = _graph(tmp_path, [leaf, w] + step)
    assert carried_state(graph, "y1", "y2") == {"later": "b", "via": "value", "lines": [6, 7], "op": None}
    assert carried_state(graph, "y2", "y1")["later"] == "a"
    # f(x) writes x in place (line 4) and is called for each side: the second reads the first's writes.
    twice = []
    for k, read in ((1, "x"), (2, "m1")):
        twice += [call(f"s{k}", "aten.sub_.Tensor", [{"node": read}, 0.5], 4),
                  call(f"m{k}", "aten.mul_.Tensor", [{"node": f"s{k}"}, 2.0], 5),
                  call(f"r{k}", "aten.mean.default", [{"node": f"m{k}"}], 6)]
    graph = _graph(tmp_path, [leaf] + twice)
    assert carried_state(graph, "r1", "r2") == {"later": "b", "via": "in-place", "lines": [4], "op": "sub_"}
    # Not one shared in-place preparation both sides read, then each computing its own way.
    shared = [call("s", "aten.mul_.Tensor", [{"node": "x"}, 2.0], 3),
              call("a", "aten.exp.default", [{"node": "s"}], 5),
              call("b", "aten.sub_.Tensor", [{"node": "s"}, 1.0], 6),
              call("bb", "aten.exp.default", [{"node": "b"}], 6)]
    assert carried_state(_graph(tmp_path, [leaf] + shared), "a", "bb") is None
    # Nor a value checked against one computed from it directly (a round trip), with no state
    # written in between.
    trip = [call("y", "aten.exp.default", [{"node": "x"}], 4), call("back", "aten.log.default", [{"node": "y"}], 5)]
    assert carried_state(_graph(tmp_path, [leaf] + trip), "back", "y") is None
    # Nor two computations from one unchanged input.
    apart = [call("a", "aten.exp.default", [{"node": "x"}], 5), call("b", "aten.exp.default", [{"node": "x"}], 6)]
    assert carried_state(_graph(tmp_path, [leaf] + apart), "a", "b") is None


def test_an_op_both_sides_call_on_other_inputs_is_named_as_on_both(tmp_path):
    """Attention on a padded batch against attention on each sequence alone: each call has
    no counterpart (its inputs differ), but neither side lacks the op, and saying only "no
    counterpart on the other side" reads as if one did."""
    from triage.classify.wording import parting_text

    graph = _graph(tmp_path, [
        {"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"},
        {"name": "w", "op": "leaf", "line": 3, "dtype": "float32", "kind": "random"},
        call("padded", "aten.constant_pad_nd.default", [{"node": "x"}, [0, 2]], 4),
        call("a", "aten.mm.default", [{"node": "padded"}, {"node": "w"}], 5),
        call("b", "aten.mm.default", [{"node": "x"}, {"node": "w"}], 6)])
    parted = part_ways(graph, "a", "b")
    assert parted["on_both"] == ["aten.mm.default"]
    assert "(both call `aten.mm.default`, each on inputs the other's call does not have)" in \
        parting_text(parted, ("`a`", "`b`"))



def test_a_long_readback_assigned_to_a_name_is_named_by_it():
    """`acc32 = (logits32.argmax(dim=1) == labels).float().mean().item()` (nu25 c19): the
    expression read back is too long to name it, the name it is assigned to is the script's."""
    source = ("acc32 = (logits32.argmax(dim=1) == labels).float().mean().item()\n"
              "total = float(x.sum())\nprint(acc32, x.item())\nn, m = a.item(), b.item()\n")
    assert readback_name(source, 1, ".item()") is None
    assert assigned_readback(source, 1, ".item()") == "acc32"
    assert assigned_readback(source, 2, "float()") == "total"
    assert assigned_readback(source, 3, ".item()") is None  # no assignment on the line
    assert assigned_readback(source, 4, ".item()") is None  # two names

    assert as_receiver("total16.float() / losses.numel()") == "(total16.float() / losses.numel())"
    assert as_receiver("x[0].sum()") == "x[0].sum()" and as_receiver("-x") == "(-x)"


def test_a_running_total_a_loop_adds_to_is_found_where_two_sides_part(tmp_path):
    """`total16 += losses[step].bfloat16()` 3,000 times (nu25 c21): a chain of in-place
    additions at one line, each adding to the last one's result, is the accumulator the
    explanation names; a few additions, or additions not chained, are not one."""
    nodes = [{"name": "x", "op": "leaf", "line": 2, "dtype": "float32", "kind": "random"},
             call("t32", "aten.zeros.default", [[]], 3), call("t16", "aten.zeros.default", [[]], 4)]
    last32, last16 = "t32", "t16"
    for i in range(70):
        nodes += [call(f"s{i}", "aten.select.int", [{"node": "x"}, 0, i], 6),
                  call(f"a{i}", "aten.add_.Tensor", [{"node": last32}, {"node": f"s{i}"}], 7),
                  {**call(f"h{i}", "aten._to_copy.default", [{"node": f"s{i}"}], 8), "dtype": "bfloat16"},
                  {**call(f"b{i}", "aten.add_.Tensor", [{"node": last16}, {"node": f"h{i}"}], 8), "dtype": "bfloat16"}]
        last32, last16 = f"a{i}", f"b{i}"
    parted = part_ways(_graph(tmp_path, nodes), last32, last16)
    assert {(s["side"], s["line"], s["terms"], s["dtype"]) for s in parted["running_sums"]} == {
        ("a", 7, 70, "float32"), ("b", 8, 70, "bfloat16")}
    few = part_ways(_graph(tmp_path, nodes[:3 + 4 * 10]), "a9", "b9")
    assert few["running_sums"] == []


def test_a_library_checks_own_comparison_is_named_by_what_it_compares():
    from triage.operands import library_check_operands

    source = "import torch\nok = torch.autograd.gradcheck(f, (x, w), raise_exception=False)\nassert torch.allclose(a, b)\n"
    assert library_check_operands(source, 2, "torch.allclose") == (
        "gradcheck", ("`gradcheck`'s analytical Jacobian", "`gradcheck`'s finite-difference Jacobian"))
    assert library_check_operands(source, 3, "torch.allclose") is None  # the script's own allclose
    assert library_check_operands(source, 2, "torch.testing.assert_close") is None


def test_a_batch_norm_in_training_mode_against_eval_mode_is_two_functions_by_design(tmp_path):
    """`bn(x)` in training mode against `bn.eval(); bn(x)` on the batch the running statistics
    converged on (a thirtieth new user): eval's outputs are √(7/8) of training's for 8 rows,
    since the running variance is the unbiased estimate. It was "one of the two paths computes
    something else" with only the flag that differs; the design is said."""
    leaves = [{"name": n, "op": "leaf", "line": 6, "dtype": "float32", "kind": "random", "shape": [4]}
              for n in ("w", "b", "rm", "rv")]
    nodes = [{"name": "x", "op": "leaf", "line": 6, "dtype": "float32", "kind": "random", "shape": [8, 4]}, *leaves]
    stats = [{"node": n} for n in ("x", "w", "b", "rm", "rv")]
    train = call("train", "aten.native_batch_norm.default", stats + [True, 0.1, 1e-5], 10)
    evaluated = call("eval", "aten.native_batch_norm.default", stats + [False, 0.0, 1e-5], 12)
    parted = part_ways(_graph(tmp_path, nodes + [train, evaluated]), "eval", "train")
    said = " ".join(parted["hints"])
    assert "at line 10 normalizes with the batch's own statistics (training mode)" in said
    assert "line 12 with the running ones (eval mode): two functions by design" in said
    assert "√((n − 1)/n)" in said and said.index("training mode") < said.index("takes the constant False")
    same_mode = call("eval", "aten.native_batch_norm.default", stats + [True, 0.0, 1e-5], 12)
    plain = part_ways(_graph(tmp_path, nodes + [train, same_mode]), "eval", "train")
    assert not any("two functions by design" in h for h in plain["hints"])


def test_integers_cast_to_float32_on_one_side_are_said_to_round_past_two_to_the_24(tmp_path):
    """Token ids through float32 features and back (a thirty-first new user's): the parting was
    "`aten.stack` is a step the other side does not take"; the cast that rounds 16777217 to
    16777216 is named, with float32's exact-integer limit."""
    ids = {"name": "ids", "op": "leaf", "line": 6, "dtype": "int64", "kind": "input", "shape": [6]}
    cast = call("as_float", "aten._to_copy.default", [{"node": "ids"}], 7, dtype={"dtype": "float32"})
    ones = {"name": "ones", "op": "leaf", "line": 7, "dtype": "float32", "kind": "factory", "shape": [6]}
    stacked = call("feats", "aten.stack.default", [[{"node": "as_float"}, {"node": "ones"}], 1], 7)
    column = call("col", "aten.select.int", [{"node": "feats"}, 1, 0], 8)
    back = call("back", "aten._to_copy.default", [{"node": "col"}], 8, dtype={"dtype": "int64"})
    back["dtype"] = "int64"
    alias = call("same", "aten.alias.default", [{"node": "ids"}], 9)
    alias["dtype"] = "int64"
    parted = part_ways(_graph(tmp_path, [ids, cast, ones, stacked, column, back, alias]), "same", "back")
    assert parted["integer_cast"]["limit"] == 2 ** 24
    assert "`aten._to_copy.default` at line 7 converts int64 values to float32, which holds every integer " \
           "exactly only up to 2^24 = 16,777,216" in parted["integer_cast"]["text"]
    # Said only against values that reach the limit (counts of a few thousand cast to float32
    # are exact: a thirty-second new user's precision and recall).
    from triage.classify.wording import parting_text

    assert "2^24" in parting_text(parted, ("`ids`", "`back`"), largest=2e7)
    assert "2^24" not in parting_text(parted, ("`ids`", "`back`"), largest=5000.0)
    floats = dict(ids, dtype="float64")
    parted = part_ways(_graph(tmp_path, [floats, cast, ones, stacked, column, back, alias]), "same", "back")
    assert parted["integer_cast"] is None
