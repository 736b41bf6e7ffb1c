"""Kernel preparation: everything BCC needs before the first probe is compiled.

Runs in the agent (not in a setup script) because the agent often starts inside
a fresh `ip netns exec` mount namespace, where /sys is remounted and tracefs is
missing. Steps, each failing with one UserError line (cause; fix):

1. root: loading BPF and mounting tracefs need it; and the capabilities the enabled
   probes need, which a container that drops the rest (the DaemonSet) may lack;
2. BPF: the bpf() syscall creates a map (and BTF is reported when present);
3. tracefs at /sys/kernel/tracing (and debugfs at /sys/kernel/debug, best effort):
   BCC reads tracepoint formats there, and picks its tracefs path at import time,
   so this must run before `import bcc`;
4. kernel headers for BCC's clang: the running kernel's /lib/modules/R/build when it
   has a Makefile and include/, else the newest distribution package
   (/usr/src/linux-headers-V-<arch> + -common, linked as /lib/modules/R/build and
   /source), or the configured `kernel_headers`. Mismatched headers are harmless
   because our programs read only tracepoint fields, __sk_buff and registers.

The decisions (plan_headers) are pure functions of directory contents, unit-tested
with fake trees; apply_links/ensure_mounts do the side effects.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import logging
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.errors import UserError

log = logging.getLogger("fabricscope.agent.kernel")

_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}


@dataclass(frozen=True)
class HeadersPlan:
    """Where BCC will find kernel headers, and which links make it so."""

    build: Path                      # /lib/modules/R/build resolves here
    source: Path                     # /lib/modules/R/source resolves here
    origin: str                      # human words for the log line
    links: tuple[tuple[Path, Path], ...] = field(default=())   # (link, target) to create

    def describe(self) -> str:
        return f"kernel headers: {self.origin} ({self.build})"


def _usable(path: Path) -> bool:
    return (path / "Makefile").is_file() and (path / "include").is_dir()


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", name))


def _distribution_headers(src_root: Path, arch: str) -> list[tuple[Path, Path]]:
    """(build, source) pairs from linux-headers-V-<arch> packages, newest first."""
    found = []
    for build in src_root.glob(f"linux-headers-*-{arch}"):
        if not _usable(build):
            continue
        common = build.with_name(build.name[: -len(arch)] + "common")
        found.append((build, common if (common / "include").is_dir() else build))
    return sorted(found, key=lambda pair: _version_key(pair[0].name), reverse=True)


def _links_for(modules_dir: Path, build: Path, source: Path) -> tuple[tuple[Path, Path], ...]:
    wanted = ((modules_dir / "build", build), (modules_dir / "source", source))
    return tuple((link, target) for link, target in wanted
                 if not (link.is_symlink() and Path(os.readlink(link)) == target))


def plan_headers(release: str, configured: str = "", *, modules_root: Path = Path("/lib/modules"),
                 src_root: Path = Path("/usr/src"), arch: str | None = None) -> HeadersPlan:
    """Decide where the headers come from. Raises UserError when there are none."""
    arch = arch or _DEB_ARCH.get(platform.machine(), platform.machine())
    modules_dir = modules_root / release
    build_link = modules_dir / "build"
    if configured:
        build = Path(configured)
        if not _usable(build):
            raise UserError(f"kernel_headers {configured} has no Makefile and include/",
                            "point kernel_headers at a kernel headers (build) directory")
        if build_link.exists() and not build_link.is_symlink():
            raise UserError(f"{build_link} is a real directory, not a link; it cannot point "
                            f"at kernel_headers {configured}",
                            "unset kernel_headers to use it, or remove that directory")
        common = build.with_name(build.name[: -len(arch)] + "common") \
            if build.name.endswith("-" + arch) else build
        source = common if (common / "include").is_dir() else build
        return HeadersPlan(build, source, "config kernel_headers",
                           _links_for(modules_dir, build, source))
    if _usable(build_link):
        source = modules_dir / "source"
        how = "linked earlier" if build_link.is_symlink() else "running kernel's"
        return HeadersPlan(build_link.resolve(),
                           source.resolve() if source.exists() else build_link.resolve(),
                           f"{how} {build_link}")
    candidates = _distribution_headers(src_root, arch)
    if not candidates:
        raise UserError(f"no kernel headers for BCC: {build_link} is missing and {src_root} "
                        f"holds no linux-headers-*-{arch} package",
                        f"install them (apt-get install linux-headers-{arch}) or set "
                        "kernel_headers")
    if build_link.exists() and not build_link.is_symlink():
        raise UserError(f"{build_link} exists but has no Makefile and include/",
                        "remove it (the agent then links the distribution headers) or set "
                        "kernel_headers")
    build, source = candidates[0]
    return HeadersPlan(build, source, f"distribution package {build.name[len('linux-headers-'):]}"
                       f" for kernel {release}", _links_for(modules_dir, build, source))


def apply_links(plan: HeadersPlan) -> None:
    """Create the planned symlinks atomically (other agents may race us)."""
    for link, target in plan.links:
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.{os.getpid()}")
            if tmp.is_symlink():
                tmp.unlink()
            tmp.symlink_to(target)
            os.replace(tmp, link)
        except OSError as exc:
            raise UserError(f"cannot link {link} -> {target}: {exc.strerror}",
                            "run as root on a writable /lib/modules, or set kernel_headers") \
                from None


# --- root, BPF, mounts -------------------------------------------------------------------

def check_root(euid: int | None = None) -> None:
    if (os.geteuid() if euid is None else euid) != 0:
        raise UserError("must run as root to load BPF programs and mount tracefs",
                        "run with sudo")


class Capability(enum.IntEnum):
    """The capabilities a probe may need, by their bit in /proc/PID/status CapEff."""

    NET_ADMIN = 12
    SYS_PTRACE = 19
    SYS_ADMIN = 21
    SYS_RESOURCE = 24
    PERFMON = 38
    BPF = 39


#: what each is for, in the one line that names a missing one
CAPABILITY_USE = {
    Capability.BPF: "load BPF programs and maps",
    Capability.PERFMON: "attach tracepoints and uprobes",
    Capability.NET_ADMIN: "attach TC programs to the NICs",
    Capability.SYS_PTRACE: "read other containers' /proc/PID/maps and root",
    Capability.SYS_RESOURCE: "raise RLIMIT_MEMLOCK for BPF maps (kernels before 5.11)",
}
#: before 5.8 there was no CAP_BPF or CAP_PERFMON: CAP_SYS_ADMIN covers both, and still does
COVERED_BY_SYS_ADMIN = (Capability.BPF, Capability.PERFMON)
MEMCG_ACCOUNTING = (5, 11)        # BPF memory charged to the cgroup, not RLIMIT_MEMLOCK


def capability_set(name: str = "CapEff", status: Path = Path("/proc/self/status")) -> int:
    """One of a process's capability sets (CapEff, CapBnd, ...) as a bit mask."""
    for line in status.read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1], 16)
    return 0


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    return capability_set("CapEff", status)


def _release(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def missing_capabilities(needs: dict[str, tuple[Capability, ...]], effective: int,
                         release: str) -> dict[Capability, list[str]]:
    """Capability -> the probes that need it and lack it. BPF probes need
    SYS_RESOURCE too where BPF memory counts against RLIMIT_MEMLOCK."""
    def has(cap: Capability) -> bool:
        return bool(effective >> cap & 1) or (
            cap in COVERED_BY_SYS_ADMIN and bool(effective >> Capability.SYS_ADMIN & 1))

    missing: dict[Capability, list[str]] = {}
    for probe, caps in needs.items():
        if Capability.BPF in caps and _release(release) < MEMCG_ACCOUNTING:
            caps = (*caps, Capability.SYS_RESOURCE)
        for cap in caps:
            if not has(cap):
                missing.setdefault(cap, []).append(probe)
    return dict(sorted(missing.items()))


def check_capabilities(needs: dict[str, tuple[Capability, ...]], effective: int | None = None,
                       release: str | None = None) -> None:
    """One line naming every capability the enabled probes need and the process lacks."""
    missing = missing_capabilities(
        needs, effective_capabilities() if effective is None else effective,
        os.uname().release if release is None else release)
    if missing:
        what = "; ".join(f"CAP_{cap.name} ({CAPABILITY_USE[cap]}: {', '.join(probes)})"
                         for cap, probes in missing.items())
        names = ", ".join(cap.name for cap in missing)
        raise UserError(f"missing capabilit{'ies' if len(missing) > 1 else 'y'} {what}",
                        f"add {names} to the agent container's securityContext.capabilities."
                        "add, or leave those probes out (--probes)")


_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_MAP_CREATE, _BPF_MAP_TYPE_ARRAY = 0, 2


def check_bpf(btf_path: Path = Path("/sys/kernel/btf/vmlinux")) -> bool:
    """Create and close a one-entry array map. Returns whether kernel BTF is present."""
    nr = _SYS_BPF.get(platform.machine())
    if nr is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 30)(_BPF_MAP_TYPE_ARRAY, 4, 4, 1)   # type key value entries
        fd = libc.syscall(nr, _BPF_MAP_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
        if fd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSYS:
                raise UserError("this kernel has no BPF syscall (CONFIG_BPF_SYSCALL off)",
                                "run on a kernel built with BPF support")
            raise UserError(f"the bpf() syscall failed: {os.strerror(err)}",
                            "run as root without a seccomp/LSM policy that blocks bpf()")
        os.close(fd)
    return btf_path.exists()


@dataclass(frozen=True)
class Mount:
    fstype: str
    target: Path
    required: bool
    probe: str            # a path that exists once it is mounted


MOUNTS = (Mount("tracefs", Path("/sys/kernel/tracing"), True, "events"),
          Mount("debugfs", Path("/sys/kernel/debug"), False, "tracing"))


def missing_mounts(mounts: tuple[Mount, ...] = MOUNTS) -> list[Mount]:
    return [m for m in mounts if not (m.target / m.probe).exists()]


def _mount(m: Mount) -> str | None:
    """Mount one filesystem; returns an error text or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not m.target.is_dir():
        return f"{m.target} does not exist"
    if libc.mount(b"nodev", str(m.target).encode(), m.fstype.encode(), 0, None) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def ensure_mounts(mounts: tuple[Mount, ...] = MOUNTS) -> list[str]:
    """Mount what is missing; returns what was mounted. Required failures raise."""
    done = []
    for m in missing_mounts(mounts):
        err = _mount(m)
        if err is None:
            done.append(f"{m.fstype} on {m.target}")
        elif m.required:
            raise UserError(f"cannot mount {m.fstype} on {m.target}: {err}",
                            f"run as root, or mount it first: mount -t {m.fstype} nodev {m.target}")
        else:
            log.debug("%s not mounted on %s: %s (not needed)", m.fstype, m.target, err)
    return done


@dataclass(frozen=True)
class KernelInfo:
    release: str
    btf: bool
    headers: HeadersPlan
    mounted: tuple[str, ...]


def prepare(kernel_headers: str = "",
            needs: dict[str, tuple[Capability, ...]] | None = None) -> KernelInfo:
    """All checks and fixes, in order; logs one line with the headers used. needs:
    the capabilities each enabled probe needs (Probe.capabilities)."""
    check_root()
    check_capabilities(needs or {})
    btf = check_bpf()
    mounted = tuple(ensure_mounts())
    release = os.uname().release
    plan = plan_headers(release, kernel_headers)
    apply_links(plan)
    log.info("%s%s", plan.describe(), f"; mounted {', '.join(mounted)}" if mounted else "")
    return KernelInfo(release, btf, plan, mounted)
