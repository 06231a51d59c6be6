#!/usr/bin/env python3
"""Module graph of each crate under crates/, from `crate::` paths in its sources.

Prints each crate's edges (module -> modules it names) and fails if any crate has an
import cycle between its top-level modules. `--graph` prints the edges too.
"""
import os
import re
import sys

PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `use crate::{a, b::c}` names several modules in one group.
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def top_module(src_dir, path):
    rel = os.path.relpath(path, src_dir)
    head = rel.split(os.sep)[0]
    name = head[:-3] if head.endswith(".rs") else head
    return None if name in ("lib", "main") else name


def strip_tests(text):
    # Tests may reach anywhere; the graph is about the library's own shape.
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def crate_graph(src_dir):
    modules = set()
    edges = {}
    for root, _, files in os.walk(src_dir):
        if os.sep + "bin" in root[len(src_dir):]:
            continue
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            me = top_module(src_dir, path)
            if me is None:
                continue
            modules.add(me)
            text = strip_tests(open(path, encoding="utf-8").read())
            names = set(PATH.findall(text))
            for group in GROUP.findall(text):
                for item in re.split(r",", group):
                    item = item.strip().split("::")[0].strip()
                    if item:
                        names.add(item)
            edges.setdefault(me, set()).update(n for n in names if n != me)
    for m in edges:
        edges[m] &= modules
    return modules, edges


def cycles(modules, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return out


def main():
    show = "--graph" in sys.argv
    bad = 0
    for crate in sorted(os.listdir("crates")):
        src = os.path.join("crates", crate, "src")
        if not os.path.isdir(src):
            continue
        modules, edges = crate_graph(src)
        if show:
            print(f"{crate}:")
            for m in sorted(modules):
                print(f"  {m} -> {', '.join(sorted(edges.get(m, ()))) or '-'}")
        for comp in cycles(modules, edges):
            bad += 1
            print(f"cycle in {crate}: {' <-> '.join(comp)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
