"""The plan imports leaf modules only: nothing it imports (at module level or inside a function)
leads back to the plan, so there is no circle through it and no import of its callers."""
from __future__ import annotations

import ast
from pathlib import Path

import turbotrain

PACKAGE = Path(turbotrain.__file__).parent
PLAN = "turbotrain.train.plan"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of ours that `name` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a import b`: module a.b when b is one; else the name b of module a. The
            # parent packages a import runs first are not edges (turbotrain.train's __init__
            # imports the trainer only inside a function).
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def reachable(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def leading_back(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module outside the plan that the plan imports, with the plan modules it reaches."""
    plan = {name for name in graph if name == PLAN or name.startswith(PLAN + ".")}
    outside = {target for name in plan for target in graph[name]} - plan
    return {target: sorted(reachable({target}, graph) & plan) for target in outside
            if reachable({target}, graph) & plan}


def the_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_nothing_the_plan_imports_leads_back_to_it():
    graph = the_graph()
    assert not leading_back(graph), leading_back(graph)
    plan_imports = set().union(*(graph[name] for name in graph if name.startswith(PLAN)))
    assert "turbotrain.train.weights.finetune" not in plan_imports  # the LR rules: plan/recipe.py
    assert "turbotrain.train.engine.batch_finder" not in plan_imports


def test_the_walk_resolves_relative_imports_and_sees_a_planted_circle():
    graph = the_graph()
    assert {"turbotrain.train.errors", "turbotrain.train.models.models",
            "turbotrain.train.plan.rules"} <= graph["turbotrain.train.plan.core"]
    # The re-export models.py had (`from .plan.rules import model`) made such a circle.
    models = "turbotrain.train.models.models"
    graph[models] = graph[models] | {PLAN + ".rules"}
    assert models in leading_back(graph)
