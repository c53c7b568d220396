"""Facts read from XLA's HLO text."""

from __future__ import annotations

import re

_ALIASED = re.compile(r"\{[\d,]*\}: \((\d+), \{[\d,]*\}, (?:may|must)-alias\)")
_DONORS = re.compile(r"buffer_donor=\{ ((?:\(\d+, \{[\d,]*\}\)(?:, )?)+) \}")


def donated_parameters(hlo_text: str) -> list[int]:
    """The parameters a compiled module's run consumes, read from its header (the first
    line): aliased to an output (JAX's ``donate_argnums``) or donated. The runtime deletes
    the arrays passed for them."""
    header = hlo_text.split("\n", 1)[0]
    donated = {int(number) for number in _ALIASED.findall(header)}
    for donors in _DONORS.findall(header):
        donated.update(int(number) for number in re.findall(r"\((\d+), ", donors))
    return sorted(donated)
