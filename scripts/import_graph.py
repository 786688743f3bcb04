"""How turbotrain's modules import each other: the numbers that say whether the layout shows the
architecture (issue 25). Standard library only (ast); it reads the files, it imports nothing.

    python scripts/import_graph.py                # the turbotrain package next to this script
    python scripts/import_graph.py --json         # the same, as one JSON object
    python scripts/import_graph.py --root PKG --layers "pkg.cli > pkg.train > pkg.datasets"

What it prints:

* modules per folder (`__init__.py` counted), with their lines;
* import levels: the longest chain of module-level imports among our modules (a module that
  imports none of ours is on level 1; an import cycle counts as one step), and the same among
  each top-level package's own modules;
* module-level imports that go back up the layer order (`--layers`, top first: a module may
  import what is below its own layer, and its own layer), then the same for function-level ones;
* import cycles: among module-level imports, and again counting function-level ones too;
* function-level imports: of our own modules, and in all; each of ours must say why it is not
  at module level in a comment that starts with `lazy:`, on its line or on the comment line
  right above it (or above the run of imports it opens); those that do not are listed;
* the ten longest functions (methods and nested functions included), by lines.

An edge goes to the module an import names: `from a.b import c` is an edge to `a.b.c` when that
is one of our modules, else to `a.b`. The parent packages Python runs first (`a/__init__.py`)
are not counted as edges. Imports under `if TYPE_CHECKING:` are never run and are left out.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from pathlib import Path

# The layer order, top first. A group is "prefix, prefix"; a module belongs to the group of the
# longest prefix that names it or a package above it. train's and datasets' folders are ordered
# too (docs/ARCHITECTURE.md "Layout"), so that an import from one into a folder above it (plan
# importing engine, beton importing remote) is reported. turbotrain.train itself (__init__, cli)
# is train's top, turbotrain.datasets (__init__: open_dataset; synthetic) datasets'.
# turbotrain.files (untrusted, safe_create, folder_lock) is below every package that reads or
# writes files, above the leaf modules (printable, os_failure) it uses.
DEFAULT_LAYERS = (
    "turbotrain.cli, turbotrain.__main__, turbotrain.demo, turbotrain.lightning"
    " > turbotrain.train"
    " > turbotrain.train.tools"
    " > turbotrain.train.use"
    " > turbotrain.train.engine"
    " > turbotrain.train.weights"
    " > turbotrain.train.records"
    " > turbotrain.train.step"
    " > turbotrain.train.plan"
    " > turbotrain.train.models"
    " > turbotrain.train.config"
    " > turbotrain.train.errors"
    " > turbotrain.pipeline"
    " > turbotrain.datasets"
    " > turbotrain.datasets.prepare"
    " > turbotrain.datasets.sources"
    " > turbotrain.datasets.remote"
    " > turbotrain.datasets.beton"
    " > turbotrain.datasets.errors"
    " > turbotrain.files"
    " > turbotrain"
)
FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_nodes(tree: ast.Module):
    """(node, in_function) for every import statement that can run."""
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child, in_function):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            out.append((child, in_function))
        visit(child, in_function or isinstance(child, FUNCTION_NODES))

    visit(tree, False)
    return out


def comments(text: str) -> dict[int, str]:
    """line -> the comment on it (tokenize, so a '#' inside a string is not one)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def lazy_reason(node, lines: list[str], notes: dict[int, str]) -> str | None:
    """The `# lazy: why` of a function-level import: on its own line, or on the comment line
    above it or above the run of import lines it belongs to (blank lines included)."""
    def reason(line: int) -> str | None:
        text = notes.get(line, "")
        return text.split("lazy:", 1)[1].strip() if "lazy:" in text else None

    found = reason(node.lineno)
    line = node.lineno - 1
    while found is None and line >= 1 and (
            lines[line - 1].lstrip().startswith(("from ", "import "))
            or not lines[line - 1].strip()):  # isort's blank between sections
        found = reason(line)
        line -= 1
    if found is None and line >= 1 and lines[line - 1].lstrip().startswith("#"):
        found = reason(line)
    return found


def targets(node, module: str, is_package: bool, ours: set[str]) -> list[str]:
    """The modules an import statement names (ours or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(sub if sub in ours else base)
    return list(dict.fromkeys(found))


def our_module(name: str, ours: set[str]) -> str | None:
    """`name` or the nearest package above it that is one of ours (`import a.b.c` of a name)."""
    while name:
        if name in ours:
            return name
        name = name.rpartition(".")[0]
    return None


def parse_layers(spec: str) -> list[list[str]]:
    return [[p.strip() for p in group.split(",") if p.strip()] for group in spec.split(">")]


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    best, best_len = None, -1
    for rank, group in enumerate(layers):
        for prefix in group:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    return best


def strongly_connected(nodes, edges) -> list[list[str]]:
    """Tarjan's SCCs (iterative), each sorted; only those that are cycles."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        scc.append(member)
                        if member == node:
                            break
                    if len(scc) > 1 or node in edges.get(node, ()):
                        sccs.append(sorted(scc))
    return sorted(sccs, key=lambda s: (-len(s), s))


def shortest_cycle(scc: list[str], edges) -> list[str]:
    """A shortest cycle through the SCC's first member (breadth first), as a path."""
    members, start = set(scc), scc[0]
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [start]


def count_cycles(nodes, edges, cap: int = 100_000) -> int:
    """Elementary cycles (each counted once), up to `cap`: a simple search from each node in
    order, never revisiting a smaller node."""
    order = {n: i for i, n in enumerate(sorted(nodes))}
    count = 0
    for start in sorted(nodes):
        s = order[start]
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        on_path = {start}
        while stack:
            node, children = stack[-1]
            for child in children:
                if child == start:
                    count += 1
                    if count >= cap:
                        return count
                elif child not in on_path and order.get(child, -1) > s:
                    on_path.add(child)
                    stack.append((child, iter(sorted(edges.get(child, ())))))
                    break
            else:
                stack.pop()
                on_path.discard(node)
    return count


def levels(nodes, edges) -> tuple[dict[str, int], list[str]]:
    """Each module's level (1 + the highest level it imports; a cycle is one step) and a longest
    chain, top first."""
    sccs = strongly_connected(nodes, edges)
    component = {n: n for n in nodes}
    for scc in sccs:
        for member in scc:
            component[member] = scc[0]
    level, below = {}, {}

    def visit(node):
        # Iterative post-order over the condensed graph.
        todo = [(node, False)]
        while todo:
            n, done = todo.pop()
            c = component[n]
            if c in level and not done:
                continue
            members = [m for m in nodes if component[m] == c]
            deps = {component[d] for m in members for d in edges.get(m, ()) if component[d] != c}
            if not done:
                todo.append((n, True))
                todo.extend((d, False) for d in sorted(deps) if d not in level)
                continue
            best = max(deps, key=lambda d: (level[d], d), default=None)
            level[c] = 1 + (level[best] if best else 0)
            below[c] = best

    for n in sorted(nodes):
        visit(n)
    top = max(sorted(level), key=lambda c: level[c])
    chain = [top]
    while below[chain[-1]]:
        chain.append(below[chain[-1]])
    return {n: level[component[n]] for n in nodes}, chain


def cycles(nodes, edges) -> dict:
    return {"components": [{"modules": scc, "example": shortest_cycle(scc, edges)}
                           for scc in strongly_connected(nodes, edges)],
            "elementary": count_cycles(nodes, edges)}


def analyse(root: Path, layer_spec: str) -> dict:
    root = root.resolve()
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {module_name(p, root): p for p in files}
    # A compiled extension (pipeline/_native*.so) is one of ours too: an import of it is an
    # edge to it, not to the package it sits in.
    ours = set(modules) | {module_name(p.with_name(p.name.split(".")[0] + ".py"), root)
                           for p in root.rglob("*") if p.suffix in (".so", ".pyd")}
    layers = parse_layers(layer_spec)
    module_edges: dict[str, set[str]] = {m: set() for m in ours}
    all_edges: dict[str, set[str]] = {m: set() for m in ours}
    function_imports = function_imports_ours = 0
    unexplained = []
    back_up = {"module": [], "function": []}
    functions = []
    folders: dict[str, list[int]] = {}
    for name, path in sorted(modules.items()):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        lines, notes = text.splitlines(), comments(text)
        folder = str(path.parent.relative_to(root.parent))
        folders.setdefault(folder, [0, 0])
        folders[folder][0] += 1
        folders[folder][1] += len(text.splitlines())
        for node, in_function in import_nodes(tree):
            found = {our_module(t, ours) for t in targets(node, name, path.name == "__init__.py",
                                                          ours)} - {None}
            if in_function:
                function_imports += 1
                function_imports_ours += bool(found)
                if found and not lazy_reason(node, lines, notes):
                    unexplained.append(f"{name}:{node.lineno}")
            for target in sorted(found):
                if target == name:
                    continue
                if not in_function:
                    module_edges[name].add(target)
                all_edges[name].add(target)
                src, dst = layer_of(name, layers), layer_of(target, layers)
                if src is not None and dst is not None and dst < src:
                    back_up["function" if in_function else "module"].append(
                        (name, node.lineno, target))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.lineno} "
                                  f"{node.name}"))
    level, chain = levels(ours, module_edges)
    # The same inside each top-level package (turbotrain.train: train's own modules only).
    within = {}
    root_name = module_name(root / "__init__.py", root)
    for package in sorted(m for m in ours if m.count(".") == root_name.count(".") + 1
                          and (modules[m].name == "__init__.py")):
        inside = {m for m in ours if m == package or m.startswith(package + ".")}
        sub = {m: {d for d in module_edges[m] if d in inside} for m in inside}
        within[package] = max(levels(inside, sub)[0].values())
    functions.sort(key=lambda f: (-f[0], f[1]))
    return {
        "folders": {f: {"modules": n, "lines": lines} for f, (n, lines) in sorted(folders.items())},
        "modules": len(ours),
        "import_levels": max(level.values(), default=0),
        "longest_chain": chain,
        "import_levels_within": within,
        "back_up_imports": {k: [f"{m}:{line} -> {t}" for m, line, t in sorted(v)]
                            for k, v in back_up.items()},
        "cycles_module_level": cycles(ours, module_edges),
        "cycles_with_function_level": cycles(ours, all_edges),
        "function_level_imports": {"ours": function_imports_ours, "all": function_imports,
                                   "unexplained": unexplained},
        "longest_functions": [{"lines": n, "function": f} for n, f in functions[:10]],
    }


def print_report(r: dict) -> None:
    print(f"modules: {r['modules']}")
    print("modules per folder:")
    for folder, v in r["folders"].items():
        print(f"  {folder + '/':<32} {v['modules']:>3} modules {v['lines']:>6} lines")
    print(f"import levels (module-level): {r['import_levels']}")
    print("  longest chain: " + " -> ".join(r["longest_chain"]))
    for package, n in r["import_levels_within"].items():
        print(f"  within {package}: {n}")
    for kind in ("module", "function"):
        items = r["back_up_imports"][kind]
        print(f"{kind}-level imports going back up the layers: {len(items)}")
        for item in items:
            print(f"  {item}")
    for key, label in (("cycles_module_level", "import cycles, module-level"),
                       ("cycles_with_function_level", "import cycles, function-level included")):
        comps = r[key]["components"]
        print(f"{label}: {len(comps)} strongly connected group(s), "
              f"{r[key]['elementary']} elementary cycle(s)")
        for c in comps:
            print(f"  {len(c['modules'])} modules, e.g. " + " -> ".join(c["example"]))
    f = r["function_level_imports"]
    print(f"function-level imports: {f['ours']} of our modules, {f['all']} in all")
    print(f"  of ours without a `# lazy:` reason: {len(f['unexplained'])}")
    for item in f["unexplained"]:
        print(f"    {item}")
    print("longest functions:")
    for item in r["longest_functions"]:
        print(f"  {item['lines']:>4} lines  {item['function']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--root", type=Path,
                        default=Path(__file__).resolve().parents[1] / "turbotrain",
                        help="the package folder (default: turbotrain/ beside scripts/)")
    parser.add_argument("--layers", default=DEFAULT_LAYERS,
                        help="the layer order, top first: 'a.cli, a.app > a.core > a' "
                             "(default: turbotrain's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not (args.root / "__init__.py").is_file():
        parser.error(f"{args.root} is not a package folder (no __init__.py)")
    report = analyse(args.root, args.layers)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
