"""The recorded op graph as triage's own process sees it (graph.json; no torch needed).

A *candidate* is a set of op nodes.  Everything else follows from it (`OpGraph.plan`): the
nodes to compute, in execution order; its inputs, the values its ops read from outside the
set (leaves, or arm A's recorded intermediates: this is how "nodes become recorded inputs");
and its outputs, the tensor values nothing in the set reads (the sinks).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage.untrusted import UntrustedOutput, read_json

# The arm's script could have rewritten graph.json (its directory is the arm's): it is read
# like any untrusted file and held to the shape triage/worker/graphio.py writes.
MAX_GRAPH_BYTES = 128 << 20
MAX_NODES = 1_000_000
TARGET = re.compile(r"\w{1,100}\.\w{1,100}\.\w{1,100}")


@dataclass(frozen=True)
class Plan:
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    key: str
    sources: dict[str, str] = field(default_factory=dict)  # input -> identical input it reuses

    def request(self, **extra: Any) -> dict[str, Any]:
        return {"key": self.key, "plan": self.nodes, "inputs": self.inputs, "outputs": self.outputs,
                "sources": self.sources, **extra}


class OpGraph:
    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)
        self.nodes: list[dict[str, Any]] = _checked_nodes(read_json(Path(directory) / "graph.json", MAX_GRAPH_BYTES))
        self.by_name = {n["name"]: n for n in self.nodes}
        self.position = {n["name"]: i for i, n in enumerate(self.nodes)}
        self.ops = [n["name"] for n in self.nodes if n["op"] == "call"]
        self.owner: dict[str, str] = {}  # getitem -> the op whose output it unpacks
        self.items: dict[str, list[str]] = {}  # op -> its getitems
        for n in self.nodes:
            if n["op"] == "getitem":
                root = self.owner.get(n["of"], n["of"])
                self.owner[n["name"]] = root
                self.items.setdefault(root, []).append(n["name"])
        self.reads: dict[str, list[str]] = {
            name: sorted(set(_refs(self.by_name[name]["args"]) + _refs(self.by_name[name]["kwargs"])),
                         key=self.position.__getitem__)
            for name in self.ops}

    def op_of(self, name: str) -> str | None:
        """The op node that computes `name` (itself, or the op a getitem unpacks); None for leaves."""
        name = self.owner.get(name, name)
        return name if name in self.reads else None

    def cone(self, name: str) -> frozenset[str]:
        """Every op whose value `name` depends on, itself included."""
        seen: set[str] = set()
        stack = [self.op_of(name)]
        while stack:
            op = stack.pop()
            if op is None or op in seen:
                continue
            seen.add(op)
            stack.extend(self.op_of(r) for r in self.reads[op])
        return frozenset(seen)

    def ordered(self, ops: Iterable[str]) -> list[str]:
        return sorted(ops, key=self.position.__getitem__)

    def plan(self, ops: frozenset[str], outputs: list[str] | None = None,
             merge: dict[str, str] | None = None) -> Plan:
        """What running `ops` means (see the module docstring).  `outputs` overrides the sinks;
        `merge` passes some inputs as another, bitwise-identical input."""
        inside = set(ops)
        nodes, read_inside = [], set()
        inputs: set[str] = set()
        for op in self.ordered(ops):
            nodes.append(op)
            nodes.extend(self.items.get(op, []))
            for r in self.reads[op]:
                if self.op_of(r) in inside:
                    read_inside.add(r)
                else:
                    inputs.add(r)
        if outputs is None:
            outputs = [n for n in nodes if n not in read_inside and self.is_tensor(n)]
        else:
            # Keep only the unpacking of the outputs asked for and of what the ops read.
            wanted = set(outputs) | read_inside
            nodes = [n for n in nodes if n in inside or n in wanted]
        ordered_inputs = sorted(inputs, key=self.position.__getitem__)
        sources = {k: v for k, v in (merge or {}).items() if k in inputs and v in inputs}
        key = hashlib.sha256(json.dumps([nodes, ordered_inputs, outputs, sorted(sources.items())]).encode()).hexdigest()[:20]
        return Plan(nodes=nodes, inputs=ordered_inputs, outputs=outputs, key=key, sources=sources)

    def is_tensor(self, name: str) -> bool:
        node = self.by_name[name]
        return node.get("dtype") is not None and not (node["op"] == "call" and self.items.get(name))

    def order_free(self, ops: Iterable[str]) -> bool:
        """No op whose result depends on an order of accumulation (the arm's worker recorded
        which ops are free of one: graphio._order_free)."""
        return all(self.by_name[o].get("order_free") is True for o in ops)

    def op_names(self, ops: Iterable[str]) -> list[str]:
        """aten op names (``aten.acosh``), in execution order, for the report."""
        return [".".join(self.by_name[o]["target"].split(".")[:2]) for o in self.ordered(ops)]


def _checked_nodes(doc: Any) -> list[dict[str, Any]]:
    """graph.json's nodes, each well-formed and reading only nodes before it; `UntrustedOutput`
    otherwise."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise UntrustedOutput(f"graph.json: nodes is not a list of at most {MAX_NODES} nodes")
    seen: set[str] = set()
    for i, n in enumerate(nodes):
        problem = _node_problem(n, seen)
        if problem:
            raise UntrustedOutput(f"graph.json: nodes/{i}: {problem}")
        seen.add(n["name"])
    return nodes


def _node_problem(n: Any, earlier: set[str]) -> str | None:
    if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not 0 < len(n["name"]) <= 200:
        return "not a node with a name"
    if n["name"] in earlier:
        return f"a second node named {n['name'][:80]!r}"
    if n.get("op") not in ("leaf", "call", "getitem"):
        return "not a leaf, a call or a getitem"
    if not isinstance(n.get("line"), (int, type(None))) or isinstance(n.get("line"), bool):
        return "line is not an integer"
    if not isinstance(n.get("dtype"), (str, type(None))):
        return "dtype is not a string"
    if n.get("op") == "getitem" and not (isinstance(n.get("of"), str) and n["of"] in earlier):
        return "a getitem of no earlier node"
    if n.get("op") == "call":
        if not isinstance(n.get("target"), str) or not TARGET.fullmatch(n["target"]):
            return "a call without an aten target"
        if not isinstance(n.get("args"), list) or not isinstance(n.get("kwargs"), dict):
            return "a call without args and kwargs"
        refs = _refs(n["args"]) + _refs(n["kwargs"])
        if not all(isinstance(r, str) and r in earlier for r in refs):
            return "a call that reads no earlier node"
    return None


def _refs(value: Any) -> list[str]:
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    if isinstance(value, dict):
        if "node" in value:
            return [value["node"]]
        if isinstance(value.get("dict"), dict):
            return [r for v in value["dict"].values() for r in _refs(v)]
    return []
