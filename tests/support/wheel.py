"""fabricscope built as a wheel (`pip wheel .`) and installed into a clean virtualenv,
as a platform team installs it: nothing of the checkout on that interpreter's path.

The wheel is built from a copy of the tracked sources (a build writes build/ and
*.egg-info beside them). The clean venv has no pip and no PyPI: its dependencies
(grpcio, numpy, ...) come from this checkout's venv by a .pth line, added as a plain
path (its .pth files, the editable install's finder among them, are not run), and
BCC from Debian's python3-bpfcc as in setup.sh. What the wheel installs is all that
names `fabricscope` on its path."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_BCC = Path("/usr/lib/python3/dist-packages/bcc")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    fabricscope: Path        # the console script the wheel installed
    site: Path               # the clean venv's site-packages


def build_wheel(tmp: Path) -> Path:
    """`pip wheel . --no-deps --no-build-isolation` over a copy of the tracked files."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    src = tmp / "src"
    for name in tracked:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    # the generated wire code is ignored by git, built by `make proto`
    shutil.copytree(ROOT / "fabricscope" / "v1", src / "fabricscope" / "v1", dirs_exist_ok=True)
    out = tmp / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("fabricscope-*.whl")
    return wheel


def install(wheel: Path, tmp: Path) -> Installed:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    bcc = tmp / "debian-bcc"
    bcc.mkdir()
    (bcc / "bcc").symlink_to(DEBIAN_BCC)
    deps = sysconfig.get_paths()["purelib"]
    (site / "fabricscope_test_deps.pth").write_text(f"{bcc}\n{deps}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "-q", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Installed(wheel, venv, python, venv / "bin" / "fabricscope", site)


def installed_wheel(tmp: Path) -> Installed:
    return install(build_wheel(tmp), tmp)
