"""YAML that is small to write and costly to read: alias bombs, self-reference, deep nesting."""

from __future__ import annotations


def alias_bomb(levels: int, indent: str = "") -> str:
    """Lines of YAML (anchors ``a0`` .. ``a{levels-1}``) whose aliases expand to 9**levels
    strings: a "billion laughs" of a few hundred bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels):
        lines.append(f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * 9) + "]")
    return "\n".join(indent + line for line in lines)


_PROGRAM = """\
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata:
  name: prog
  annotations:
{bomb}
spec:
  slices: [{{name: s, devices: 2}}]
"""

HOSTILE_MANIFESTS = [
    (
        "alias-bomb",
        _PROGRAM.format(bomb=alias_bomb(9, indent="    "))
        + "  driver: {source: 'print(1)', command: *a8}\n",
        "larger than 16 MiB once its YAML aliases are expanded",
    ),
    (
        "self-alias",
        _PROGRAM.format(bomb="    a: b") + "  x: &x [*x]\n",
        "a YAML alias refers to a node that contains it",
    ),
    (
        "deep",
        _PROGRAM.format(bomb="    a: b") + "  weight: " + "[" * 20_000 + "]" * 20_000 + "\n",
        "nested too deeply",
    ),
    (
        "huge-integer",
        _PROGRAM.format(bomb="    a: b") + "  weight: " + "1" * 5000 + "\n",
        "integer string conversion",
    ),
]
"""Program manifests of a few KiB that once took the CLI minutes, or a traceback, to read: each
is now one problem named in a second (name, text, what the problem says)."""
