#!/usr/bin/env python3
"""No import cycles in the sidecar: between its folders, nor between the files inside one.

Builds the graph of `crate::` paths each module names (its tests left out), collapses it at
every depth (top-level modules, then their submodules, ...) and fails on any cycle, naming
the modules in it. A child naming its parent is not a cycle (that is how Rust modules nest).

    scripts/check-imports.py [sidecar/src]
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "sidecar", "src")
sys.setrecursionlimit(10000)


def module_of(path):
    parts = os.path.relpath(path, root)[:-3].split(os.sep)
    return tuple(parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts)


modules = {}
for folder, _, names in os.walk(root):
    for name in names:
        if name.endswith(".rs"):
            modules[module_of(os.path.join(folder, name))] = os.path.join(folder, name)


def resolve(parts):
    for n in range(len(parts), 0, -1):
        if tuple(parts[:n]) in modules:
            return tuple(parts[:n])
    return None


path = re.compile(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)")
edges = set()
for module, file in modules.items():
    source = open(file, encoding="utf-8").read().split("#[cfg(test)]")[0]
    for named in path.findall(source):
        target = resolve(named.split("::"))
        if target and target != module and module[: len(target)] != target:
            edges.add((module, target))


def cycles(depth):
    graph = {}
    for a, b in edges:
        a, b = a[:depth], b[:depth]
        if a != b and len(a) == depth and len(b) == depth and a[:-1] == b[:-1]:
            graph.setdefault(a, set()).add(b)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append("::".join(w))
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


deepest = max(len(m) for m in modules)
bad = [(d, c) for d in range(1, deepest + 1) for c in cycles(d)]
for depth, component in bad:
    print(f"import cycle (depth {depth}): {' <-> '.join(component)}")
if bad:
    sys.exit(1)
print(f"no import cycles in {len(modules)} modules ({len(edges)} imports)")
