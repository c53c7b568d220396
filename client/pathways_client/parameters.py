"""A Python function's parameters, as ``pw.function`` and ``pw.program`` bind, label and split
the arguments of a call: static ones (``static_argnums`` / ``static_argnames``) as
``jax.jit`` takes them."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Statics = tuple[tuple[int | str, Any], ...]
"""Static arguments' values, each with its position or name."""


class Parameters:
    """The parameters of ``fun``, which messages call ``owner`` (``function 'f'``), and which
    of them are static."""

    def __init__(
        self,
        fun: Callable[..., Any],
        owner: str,
        static_argnums: int | Sequence[int] | None = (),
        static_argnames: str | Iterable[str] | None = (),
    ) -> None:
        self.owner = owner
        self.signature = _signature(fun)  # read once: keyword calls bind through it
        self.names = _positional_names(self.signature)
        self.static_positions, self.static_names = self._statics(static_argnums, static_argnames)

    @property
    def any_static(self) -> bool:
        return bool(self.static_positions or self.static_names)

    def _statics(
        self, given_numbers: Any, given_names: Any
    ) -> tuple[frozenset[int], frozenset[str]]:
        """The static arguments' positions and names, each completed from the other through
        the signature, as ``jax.jit`` does (``None``, one, or several of each)."""
        numbers = self._positions(given_numbers)
        names = (given_names,) if isinstance(given_names, str) else _items(given_names)
        if names is None or not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"{self.owner}: static_argnames: expected a name or names of arguments "
                f"(got {given_names!r})"
            )
        parameters = self.signature.parameters.values() if self.signature else ()
        kinds = {p.kind for p in parameters}
        if self.signature is not None and inspect.Parameter.VAR_POSITIONAL not in kinds:
            # As jax.jit: a position past the function's (negative ones count from its end).
            count = len(self.names)
            wrong = [n for n in numbers if not -count <= n < count]
            if wrong:
                raise ValueError(
                    f"{self.owner}: static_argnums {wrong} out of range: it takes "
                    f"{count} positional argument(s) ({', '.join(self.names)})"
                )
            numbers = tuple(n % count for n in numbers)
        elif any(n < 0 for n in numbers):
            raise ValueError(
                f"{self.owner}: static_argnums {numbers}: a negative position needs "
                "a function of a fixed number of positional arguments"
            )
        if self.signature is not None and inspect.Parameter.VAR_KEYWORD not in kinds:
            known = {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
            unknown = sorted(set(names) - known)
            if unknown:
                raise ValueError(
                    f"{self.owner}: static_argnames {unknown} name no argument of it "
                    f"(it takes {', '.join(sorted(known)) or 'none by name'})"
                )
        positions = {*numbers, *(self.names.index(n) for n in names if n in self.names)}
        named = {*names, *(self.names[n] for n in numbers if n < len(self.names))}
        return frozenset(positions), frozenset(named)

    def _positions(self, given: Any) -> tuple[int, ...]:
        """``static_argnums`` as positions: ``None``, one integer (a numpy one too), or
        several; never a bool."""
        items = _items(given)
        if items is None:
            items = (given,)
        try:
            if any(isinstance(n, bool) for n in items):
                raise TypeError
            return tuple(operator.index(n) for n in items)
        except TypeError:
            raise TypeError(
                f"{self.owner}: static_argnums: expected a position or positions of arguments "
                f"(got {given!r})"
            ) from None

    def label(self, position: int) -> str:
        """``argument 'x' (position 0)``: the argument at ``position``, for messages."""
        if position < len(self.names):
            return f"argument {self.names[position]!r} (position {position})"
        return f"argument {position}"

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Keyword arguments of positional parameters become positional, as a call by
        position compiles (and is cached) the same; the rest stay keywords."""
        if self.signature is None:  # no signature to read (a builtin): as given
            return args, kwargs
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.owner}: {error}") from None
        return bound.args, bound.kwargs

    def split_statics(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], Statics]:
        """The arguments without their static ones (``None``, an empty pytree, in their
        places), and the static ones by position or name: part of what is compiled."""
        statics: list[tuple[int | str, Any]] = [
            (position, args[position])
            for position in sorted(self.static_positions)
            if position < len(args)
        ]
        statics += [(name, kwargs[name]) for name in sorted(self.static_names) if name in kwargs]
        for where, value in statics:
            try:
                hash(value)
            except TypeError:
                label = self.label(where) if isinstance(where, int) else f"argument {where!r}"
                raise TypeError(
                    f"{label} of {self.owner} is static, so it must be hashable "
                    f"(got {type(value).__name__}; a tuple for a list)"
                ) from None
        dynamic = tuple(None if i in self.static_positions else a for i, a in enumerate(args))
        others = {name: value for name, value in kwargs.items() if name not in self.static_names}
        return dynamic, others, tuple(statics)


def statics_key(statics: Statics) -> tuple[Any, ...]:
    """Static values as a cache key: typed, as jax.jit keys them (2 and 2.0 are equal but
    compile differently)."""
    return tuple((where, type(value), value) for where, value in statics)


def with_statics(
    args: tuple[Any, ...], kwargs: dict[str, Any], statics: Statics
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with the static ones back in their places."""
    if not statics:
        return args, kwargs
    positional, keywords = list(args), dict(kwargs)
    for where, value in statics:
        if isinstance(where, int):
            positional[where] = value
        else:
            keywords[where] = value
    return tuple(positional), keywords


def _signature(fun: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _positional_names(signature: inspect.Signature | None) -> list[str]:
    if signature is None:
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def _items(given: Any) -> tuple[Any, ...] | None:
    """``given`` as a tuple of its items (``None`` as none); ``None`` if it is not iterable."""
    if given is None:
        return ()
    try:
        return tuple(given)
    except TypeError:
        return None
