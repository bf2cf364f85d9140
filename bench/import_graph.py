"""The shape of distlab's import graph, computed from the code's own imports (grimp, import-linter's parser).

    python bench/import_graph.py            # the whole package, then the engine alone
    python bench/import_graph.py --edges    # and every arrow, module by module

*Arrows*: module A imports module B (anywhere in A, also inside a function, but not under
``if TYPE_CHECKING:``, which never runs; an import of the package
``distlab`` itself, the face, counts as an arrow to ``distlab``). *Circles*: groups of modules that
import each other, directly or through others (strongly connected components of more than one module).
*Floors*: the length of the longest chain of imports, counted in modules, with each circle counted as
one floor (the height of the graph once circles are squashed). The *engine* is the package without
``teach``, ``plots``, ``slurm``, ``nodes`` and ``check`` (what a launch and warm ranks run on). The largest modules
are listed by lines of code.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import grimp

OUTSIDE_ENGINE = ("teach", "plots", "slurm", "nodes", "check")


def import_graph(package: str = "distlab") -> dict[str, set[str]]:
    """Every module of ``package`` -> the modules of ``package`` it imports (itself excluded)."""
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)
    return {m: {i for i in graph.find_modules_directly_imported_by(m) if i != m} for m in graph.modules}


def engine_only(edges: dict[str, set[str]], package: str = "distlab") -> dict[str, set[str]]:
    """The graph without the folders that build on the engine (chapters' helpers, plots, Slurm, nodes)."""
    outside = tuple(f"{package}.{name}" for name in OUTSIDE_ENGINE)
    keep = {m for m in edges if not (m in outside or m.startswith(tuple(o + "." for o in outside)))}
    return {m: edges[m] & keep for m in keep}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def floors(edges: dict[str, set[str]]) -> int:
    """The longest import chain in modules, each circle squashed into one floor."""
    group = {m: m for m in edges}
    for component in circles(edges):
        for member in component:
            group[member] = component[0]
    squashed: dict[str, set[str]] = {g: set() for g in group.values()}
    for m, targets in edges.items():
        squashed[group[m]] |= {group[t] for t in targets if group[t] != group[m]}
    height: dict[str, int] = {}

    def up(node: str) -> int:
        if node not in height:
            height[node] = 1 + max((up(t) for t in squashed[node]), default=0)
        return height[node]

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    return max((up(n) for n in squashed), default=0)


def longest_chain(edges: dict[str, set[str]]) -> list[str]:
    """One longest import chain, top first (in a graph without circles)."""
    best: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in best:
            below = max((chain(t) for t in sorted(edges[node])), key=len, default=[])
            best[node] = [node, *below]
        return best[node]

    return max((chain(n) for n in sorted(edges)), key=len, default=[])


def arrows(edges: dict[str, set[str]]) -> int:
    return sum(len(t) for t in edges.values())


def module_lines(package: str = "distlab") -> list[tuple[int, str]]:
    """(lines, module) for every module file of the package, largest first."""
    root = Path(importlib.util.find_spec(package).origin).resolve().parent  # found, not imported
    sizes = []
    for path in root.rglob("*.py"):
        name = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        sizes.append((len(path.read_text().splitlines()), name))
    return sorted(sizes, reverse=True)


def describe(title: str, edges: dict[str, set[str]]) -> str:
    found = circles(edges)
    text = f"{title}: {len(edges)} modules, {floors(edges)} floors, {arrows(edges)} arrows, {len(found)} circles"
    lines = [text, *(f"  circle: {' <-> '.join(c)}" for c in found)]
    if not found:
        lines.append("  longest chain: " + " -> ".join(m.removeprefix("distlab.") for m in longest_chain(edges)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="print every arrow")
    parser.add_argument("--largest", type=int, default=8, help="how many of the largest modules to list")
    args = parser.parse_args(argv)
    whole = import_graph()
    print(describe("distlab (whole package)", whole))
    print(describe("engine (without teach, plots, slurm, nodes, check)", engine_only(whole)))
    print("largest modules:", ", ".join(f"{name} {lines}" for lines, name in module_lines()[: args.largest]))
    if args.edges:
        for m in sorted(whole):
            print(f"{m} -> {' '.join(sorted(whole[m]))}")


if __name__ == "__main__":
    main()
