"""The container image, checked without a container engine: the Dockerfile's structure and
what its build context installs (a wheel built from exactly the files .dockerignore lets in)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from chart_helpers import ROOT, render

CONTRACT_MODULES = [
    "pathways_operator",
    "pathways_scheduler",
    "pathways_executor",
    "pathways_api",
    "pathways_client.run_graph",
    "pathways_operator.uninstall",
]
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|rustc|cargo)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


@dataclass
class Dockerfile:
    comments: str
    global_args: dict[str, str]
    stages: list[Stage]


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions of a Dockerfile by stage: continuation lines joined, comments kept apart."""
    comments, logical, pending = [], [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not pending:
                comments.append(stripped)
            continue
        if not stripped and not pending:
            continue
        pending += " " + stripped.removesuffix("\\") if pending else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            logical.append(pending.strip())
            pending = ""
    assert not pending, "a continuation line ends the file"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert instruction == "ARG", f"only ARG may precede FROM, not {instruction}"
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((instruction, args))
    return Dockerfile("\n".join(comments), global_args, stages)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def test_multi_stage_on_a_slim_python(dockerfile: Dockerfile) -> None:
    build, runtime = dockerfile.stages[0], dockerfile.stages[-1]
    assert len(dockerfile.stages) == 2
    base = dockerfile.global_args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim-\w+", base), base
    assert build.base == runtime.base == "${PYTHON_IMAGE}"
    assert build.name == "build"
    copied = runtime.args("COPY")
    assert copied == ["--from=build /opt/pathways /opt/pathways"]


def test_runtime_stage_has_no_build_tools(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stages[-1]
    for command in runtime.args("RUN"):
        assert "pip install" not in command
        assert not COMPILERS.search(command), command
        installs = re.findall(r"apt-get install ([^&]*)", command)
        packages = {word for text in installs for word in text.split() if not word.startswith("-")}
        assert packages <= {"tini"}, packages
        if installs:
            assert "rm -rf /var/lib/apt/lists/*" in command


def test_runs_as_a_numeric_non_root_user_with_a_read_only_root(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stages[-1]
    user = runtime.args("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, user
    assert gid.isdigit() and int(gid) != 0, user
    volumes = set(re.findall(r'"([^"]+)"', runtime.args("VOLUME")[-1]))
    assert volumes == {"/tmp", "/var/cache/pathways"}
    env = " ".join(runtime.args("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    for variable in ("XDG_CACHE_HOME", "JAX_COMPILATION_CACHE_DIR", "HOME"):
        value = re.search(rf"{variable}=(\S+)", env)
        assert value, variable
        assert any(value.group(1).startswith(volume) for volume in volumes), variable
    # The chart mounts writable volumes exactly where the image writes.
    deployment = render("values.yaml").one("Deployment", "-operator")
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {mount["mountPath"] for mount in mounts} == volumes
    assert runtime.args("ENTRYPOINT") == ['["/usr/bin/tini", "--"]']


def test_jax_variants_are_build_args(dockerfile: Dockerfile) -> None:
    build = dockerfile.stages[0]
    assert "JAX_VARIANT=cpu" in build.args("ARG")
    install = next(command for command in build.args("RUN") if "JAX_VARIANT" in command)
    assert 'pip install "jax==${JAX_VERSION}"' in install
    assert "tpu|cuda12|cuda13)" in install
    assert 'pip install "jax[${JAX_VARIANT}]==${JAX_VERSION}"' in install
    assert "exit 1" in install  # an unknown variant fails the build


def test_entrypoints_are_documented(dockerfile: Dockerfile) -> None:
    for module in CONTRACT_MODULES:
        assert module in dockerfile.comments, module
    assert "--build-arg JAX_VARIANT=tpu" in dockerfile.comments


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(include?, regex) per line of .dockerignore, in order (the last match wins)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append((include, re.compile(regex)))
    return patterns


def in_build_context(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker sends ``relative`` with the build context: a pattern matching a folder
    matches everything below it, and the last matching pattern decides."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    decision = True
    for include, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            decision = include
    return decision


def test_build_context_holds_what_the_dockerfile_copies(dockerfile: Dockerfile) -> None:
    patterns = dockerignore_patterns()
    build = dockerfile.stages[0]
    sources = [word for args in build.args("COPY") for word in args.split()[:-1]]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert in_build_context(source, patterns), f"{source} is excluded by .dockerignore"
    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    folders = {path.split("/")[0] for path in packaged["targets"]["wheel"]["packages"]}
    assert folders <= set(sources), folders - set(sources)
    assert not in_build_context(".venv/bin/python", patterns)
    assert not in_build_context("tests/conftest.py", patterns)
    assert not in_build_context("core/pathways_core/__pycache__/x.pyc", patterns)


def test_build_context_builds_a_wheel_with_every_component(tmp_path: Path) -> None:
    """What `pip install .` does in the build stage, from exactly the files Docker would send."""
    patterns = dockerignore_patterns()
    context = tmp_path / "context"
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    sent = [path for path in tracked if in_build_context(path, patterns)]
    for path in sent:
        if (ROOT / path).is_file():
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, context / path)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.split("/", 1)[1] for p in sent if p.endswith(".py") and "/" in p}
    missing = sorted(path for path in sources if path.startswith("pathways_") and path not in names)
    assert not missing, missing
    for module in ("pathways_scheduler", "pathways_executor", "pathways_client"):
        assert f"{module}/__main__.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "pathways = pathways_client.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    )
