"""Reading manifest files: YAML (multi-document) from files and folders, checked by the core."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from pathways_core.manifests import (
    MANIFEST_LIMIT_BYTES,
    Checked,
    Problem,
    check_manifest,
    expanded_size,
)

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Document:
    """One checked document of a manifest file (``index`` counts from 1)."""

    path: Path
    index: int
    checked: Checked

    @property
    def label(self) -> str:
        what = " ".join(part for part in (self.checked.kind, self.checked.name) if part)
        return f"{self.path}: document {self.index}" + (f" ({what})" if what else "")


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, with folders expanded to the manifests below them (sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(
                sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            )
        else:
            files.append(path)
    return files


class ManifestSyntaxError(Exception):
    """Text that cannot be read as manifests; the message says where and why."""


def parse_documents(text: str) -> Iterator[Any]:
    """The documents of YAML (or JSON) text, empty ones skipped, each bounded once its YAML
    aliases are expanded. Raises ManifestSyntaxError where the text stops making sense (the
    documents before it are yielded first)."""
    try:
        for document in yaml.safe_load_all(text):
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
    """Parse and check every document of one file; unreadable files, YAML syntax errors and
    documents too large to read become documents carrying a problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        yield Document(path, 0, _failed(f"cannot read the file: {error}"))
        return
    index = 0
    try:
        for document in parse_documents(text):
            index += 1
            yield Document(path, index, check_manifest(document))
    except ManifestSyntaxError as error:
        yield Document(path, index + 1, _failed(str(error)))


def flag_duplicates(documents: Iterable[Document]) -> list[Document]:
    """``documents``, each defining an object defined before (the same kind, namespace and
    name) given a problem saying so instead of its resource: applied together, the later one
    would replace the first."""
    first: dict[tuple[str | None, str | None, str | None], Document] = {}
    flagged = []
    for document in documents:
        resource = document.checked.resource
        if resource is not None:
            meta = getattr(resource, "metadata", None)
            key = (document.checked.kind, getattr(meta, "namespace", None), document.checked.name)
            if key in first:
                problem = Problem(
                    "metadata.name", f"defined already, by {first[key].label}: names must differ"
                )
                checked = replace(document.checked, resource=None, problems=(problem,))
                document = replace(document, checked=checked)
            else:
                first[key] = document
        flagged.append(document)
    return flagged


def _failed(message: str) -> Checked:
    return Checked(None, None, None, (Problem("", message),))
