"""Reading manifest files: YAML (multi-document) from files and folders, checked by the core."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pathways_core.manifests import (
    MANIFEST_LIMIT_BYTES,
    Checked,
    Problem,
    check_manifest,
    expanded_size,
)

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

STDIN = Path("-")
"""The path that names standard input, as ``-`` does for ``kubectl apply -f``."""


@dataclass(frozen=True)
class Document:
    """One checked document of a manifest file (``index`` counts from 1)."""

    path: Path
    index: int
    checked: Checked
    item: int | None = None  # its place in the ``items`` of a ``kind: List`` document

    @property
    def label(self) -> str:
        where = "standard input" if self.path == STDIN else str(self.path)
        if self.index == 0:  # a problem of the file as a whole
            return where
        what = " ".join(part for part in (self.checked.kind, self.checked.name) if part)
        listed = "" if self.item is None else f": items[{self.item}]"
        return f"{where}: document {self.index}{listed}" + (f" ({what})" if what else "")


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, with folders expanded to the manifests below them (sorted), each
    once (see :func:`unique_files`)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(
                sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            )
        else:
            files.append(path)
    return unique_files(files)


_P = TypeVar("_P", str, Path)


def unique_files(paths: Iterable[_P]) -> list[_P]:
    """``paths`` in order, without those naming a file named before (``./f.yaml`` after
    ``f.yaml``, a file of a folder named again): read twice, each of its documents was
    reported as a duplicate of itself."""
    seen: set[str] = set()
    unique = []
    for path in paths:
        identity = "-" if str(path) == "-" else _resolved(str(path))
        if identity not in seen:
            seen.add(identity)
            unique.append(path)
    return unique


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a symbolic link loop: the file will not read either
        return os.path.abspath(path)


class ManifestSyntaxError(Exception):
    """Text that cannot be read as manifests; the message says where and why."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice: PyYAML kept the last
    one silently (``devices: 2`` then ``devices: 4`` submitted 4), where the API server's
    strict decoding, as kubectl's, refuses it. Keys a merge (``<<: *base``) brings may be
    given again: that is what a merge is for."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # not a key a mapping may have: the constructor says so
                    continue
                if earlier is not key_node:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"the key {key!r} is given twice (first at line "
                        f"{earlier.start_mark.line + 1}): a mapping's keys must differ",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def parse_documents(text: str) -> Iterator[Any]:
    """The documents of YAML (or JSON) text, empty ones skipped, each bounded once its YAML
    aliases are expanded. Raises ManifestSyntaxError where the text stops making sense (a
    mapping giving a key twice too; the documents before it are yielded first)."""
    try:
        for document in yaml.load_all(text, Loader=_StrictLoader):  # a SafeLoader
            if document is None:  # an empty document between separators
                continue
            size = expanded_size(document, MANIFEST_LIMIT_BYTES)
            if size is None:
                raise ManifestSyntaxError(
                    "a YAML alias refers to a node that contains it (such a document has no "
                    "JSON form)"
                )
            if size > MANIFEST_LIMIT_BYTES:
                raise ManifestSyntaxError(
                    f"larger than {MANIFEST_LIMIT_BYTES >> 20} MiB once its YAML aliases are "
                    "expanded (no API server accepts it)"
                )
            yield document
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or str(error)
        raise ManifestSyntaxError(f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise ManifestSyntaxError("invalid YAML: nested too deeply") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ManifestSyntaxError(f"invalid YAML: {str(error).split(';')[0]}") from None


def read_documents(path: Path) -> Iterator[Document]:
    """Parse and check every document of one file (``-``: standard input); unreadable files,
    files of no document, YAML syntax errors and documents too large to read become documents
    carrying a problem (of index 0 for the file as a whole)."""
    try:
        if path == STDIN:
            text = sys.stdin.buffer.read().decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        yield Document(path, 0, _failed(f"cannot read the file: {error}"))
        return
    index = 0
    try:
        for document in parse_documents(text):
            index += 1
            listing = isinstance(document, dict) and document.get("kind") == "List"
            items = document.get("items") if listing else None
            if isinstance(items, list):  # a `get -o json` dump of a list
                for item, listed in enumerate(items):
                    yield Document(path, index, check_manifest(listed), item)
            else:
                yield Document(path, index, check_manifest(document))
    except ManifestSyntaxError as error:
        yield Document(path, index + 1, _failed(str(error)))
        return
    if index == 0:  # `pathways submit` refuses it: validate said "0 valid" and exit 0
        yield Document(path, 0, _failed("no documents (the file is empty, or only comments)"))


def flag_duplicates(documents: Iterable[Document]) -> list[Document]:
    """``documents``, each defining an object defined before (the same kind, namespace and
    name) given a problem saying so instead of its resource: applied together, the later one
    would replace the first."""
    first: dict[tuple[str | None, str | None, str], Document] = {}
    flagged = []
    for document in documents:
        resource = document.checked.resource
        name = document.checked.name
        # Without a name (``generateName``) each makes an object of its own: no duplicates.
        if resource is not None and isinstance(name, str) and name:
            meta = getattr(resource, "metadata", None)
            key = (document.checked.kind, getattr(meta, "namespace", None), name)
            if key in first:
                checked = replace(
                    document.checked, resource=None, problems=(defined_already(first[key].label),)
                )
                document = replace(document, checked=checked)
            else:
                first[key] = document
        flagged.append(document)
    return flagged


def object_key(document: Any) -> tuple[str | None, str | None, str] | None:
    """The kind, namespace and name of the object a manifest document defines (what
    :func:`flag_duplicates` compares), or ``None`` if it gives no name."""
    metadata = document.get("metadata") if isinstance(document, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        return None
    namespace = metadata.get("namespace")
    return (document.get("kind"), namespace if isinstance(namespace, str) else None, name)


def defined_already(first: str) -> Problem:
    """The problem of a document defining again the object that ``first`` (a document's
    label) defined: applied together, the later one would replace the first (submitted, the
    API refuses it after creating the first)."""
    return Problem("metadata.name", f"defined already, by {first}: names must differ")


def _failed(message: str) -> Checked:
    return Checked(None, None, None, (Problem("", message),))
