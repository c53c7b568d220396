"""Graph algorithms over program DAGs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class CycleError(ValueError):
    """The graph has a cycle; ``cycle`` lists its nodes in order."""

    def __init__(self, cycle: list[str]) -> None:
        path = [*cycle, cycle[0]]
        if len(path) > SHOWN_CYCLE:  # a cycle of thousands of nodes made a message of 35 KB
            hidden = len(path) - SHOWN_CYCLE + 1
            path = [*path[: SHOWN_CYCLE - 3], f"... {hidden} more ...", *path[-2:]]
        super().__init__(f"the graph has a cycle of {len(cycle)} nodes: " + " -> ".join(path))
        self.cycle = cycle


SHOWN_CYCLE = 10
"""Nodes a cycle's message names at most."""


def topological_order(dependencies: Mapping[str, Iterable[str]]) -> list[str]:
    """Order nodes so every node comes after the nodes it depends on.

    ``dependencies`` maps each node to the nodes it consumes. Ties keep the mapping's order, so
    the result is deterministic. Raises ``CycleError`` naming one cycle.
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in dependencies:
        if state.get(root) == 2:
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterable[str]]] = [(root, iter(dependencies.get(root, ())))]
        state[root] = 1
        path.append(root)
        while stack:
            node, remaining = stack[-1]
            for dependency in remaining:
                if state.get(dependency) == 1:
                    raise CycleError(path[path.index(dependency) :])
                if state.get(dependency) is None:
                    state[dependency] = 1
                    path.append(dependency)
                    stack.append((dependency, iter(dependencies.get(dependency, ()))))
                    break
            else:
                stack.pop()
                path.pop()
                state[node] = 2
                order.append(node)
    return order
