"""The import graph of fuelline has no cycle and nothing points upward (STYLE.md promises it).

An AST walk over src/fuelline finds every import of a fuelline module, at the top of a file or
inside a function (a lazy import is still a dependency; a lazy one for import cost is fine, as
long as it points downward), under `if TYPE_CHECKING:` too. Each module belongs to the layer of
the longest entry of LAYERS that names it or a package above it, and may import only from its
own layer or lower ones. The layers, lowest first, as the code stands:

0. data: what flows between stages and how it is stored: `records` (record shapes, `Location`,
   `Drop`), `fingerprints`, `progress`, `io` (readers, writers, paths, the stage layout),
   `formats` (one module per on-disk format);
1. text: `text`, the character classes and normalization that clean, dedup and chat share;
2. the step protocol and what runs steps: `pipeline.step` (Step), `pipeline.stage` (record
   stages, their contexts), `pipeline.options` (a step's Config fields), `pipeline.workdir` and
   `pipeline.stats` (the resume and stats.json contract), `pipeline.shards`, `pipeline.lifetime`,
   `pipeline.workers` and `pipeline.ray_executor` (what runs a map of tasks), `pipeline.executor`
   and `pipeline.output` (a record stage run shard by shard, into a directory or a URL);
3. the tools stages use: `tokenizer`, `serve` (inference servers), `loader`, `models`, `model_source`
   (where a model the user names lives, for `serve` and `cache` alike);
4. record stages: ingest, clean, dedup, decontaminate, and the funnel `report`;
5. `chat`, which builds on clean's poetry rules, the tokenizer and the servers;
6. `pack` and `cache`, which encode chat records;
7. running pipelines: the rest of `pipeline` (config, registry);
8. commands: `cli`, `cli_options` (a Config's fields as click options), the sub-command modules,
   the demos, `__main__`.

Within a layer modules may import each other, but no two packages (or the units LAYERS names)
may import each other, directly or round a longer loop: that is how `chat.from_poetry` →
`pack.templates` → `chat.encode` was a cycle although no module imported itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "fuelline"

LAYERS: list[list[str]] = [
    ["fuelline", "fuelline.records", "fuelline.fingerprints", "fuelline.progress", "fuelline.io", "fuelline.formats"],
    ["fuelline.text"],
    ["fuelline.pipeline.step", "fuelline.pipeline.stage", "fuelline.pipeline.options", "fuelline.pipeline.workdir",
     "fuelline.pipeline.stats", "fuelline.pipeline.shards", "fuelline.pipeline.lifetime", "fuelline.pipeline.workers",
     "fuelline.pipeline.ray_executor", "fuelline.pipeline.executor", "fuelline.pipeline.output"],
    ["fuelline.tokenizer", "fuelline.serve", "fuelline.loader", "fuelline.models", "fuelline.model_source"],
    ["fuelline.ingest", "fuelline.clean", "fuelline.dedup", "fuelline.decontaminate", "fuelline.report"],
    ["fuelline.chat"],
    ["fuelline.pack", "fuelline.cache"],
    ["fuelline.pipeline"],
    ["fuelline.cli", "fuelline.cli_options", "fuelline.__main__", "fuelline.demo", "fuelline.chat.demo", "fuelline.cache.cli",
     "fuelline.serve.cli"],
]
# (importer, imported) pairs allowed for now, each with the issue that will remove it.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The fuelline modules `name` imports, each with the line of its first import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import fuelline.io.atomic.x`: the module part
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def unit(name: str) -> tuple[int, str]:
    """(layer, the LAYERS entry that claims `name`): the longest entry naming it or a package above it."""
    claims = [(len(entry), layer, entry) for layer, entries in enumerate(LAYERS) for entry in entries
              if name == entry or (entry != "fuelline" and name.startswith(entry + "."))]
    assert claims, f"{name} is in no layer: add it (or its package) to LAYERS in {__file__}"
    _, layer, entry = max(claims)
    return layer, entry


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def allowed(edges: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {a: {b: line for b, line in targets.items() if (a, b) not in KNOWN_EXCEPTIONS} for a, targets in edges.items()}


def test_every_module_has_a_layer_and_imports_nothing_above_it():
    upward = []
    for name, targets in allowed(graph()).items():
        layer, _ = unit(name)
        for target, line in sorted(targets.items()):
            if unit(target)[0] > layer:
                upward.append(f"{name} (layer {layer}) line {line} imports {target} (layer {unit(target)[0]})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_module_is_in_an_import_cycle():
    edges = {a: set(targets) for a, targets in allowed(graph()).items()}
    assert not cycles(edges), f"import cycles: {cycles(edges)}"


def test_no_two_packages_import_each_other():
    edges: dict[str, set[str]] = {}
    for name, targets in allowed(graph()).items():
        edges.setdefault(unit(name)[1], set()).update(unit(t)[1] for t in targets if unit(t)[1] != unit(name)[1])
    assert not cycles(edges), f"cycles between packages: {cycles(edges)}"


def test_the_walk_sees_lazy_and_type_checking_imports_and_cycles(tmp_path):
    """The checks above could pass by seeing nothing: this one shows they see what they must."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fuelline.records import Drop\n"
                      "def f():\n    from fuelline.io import atomic\n    import fuelline.text\n")
    known = {"fuelline.m": source, "fuelline.records": source, "fuelline.io": source, "fuelline.io.atomic": source,
             "fuelline.text": source}
    assert imports("fuelline.m", source, known) == {"fuelline.records": 3, "fuelline.io.atomic": 5, "fuelline.text": 6}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert unit("fuelline.pipeline.config") == (7, "fuelline.pipeline")
    assert unit("fuelline.pipeline.stage") == (2, "fuelline.pipeline.stage")
