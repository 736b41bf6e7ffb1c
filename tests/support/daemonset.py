"""The agent DaemonSet's pod, run as its container runtime would run it: the image's
root filesystem under bubblewrap, with exactly the manifest's capabilities, mounts,
environment, command and host namespaces, read from the manifest itself
(deploy/kubernetes/base/agent-daemonset.yaml) so that the test and the manifest
cannot drift.

A stand-in for a kubelet and a container runtime, which cannot run here: podman
cannot start containers on this VM (crun and runc alike fail to set the container's
rlimits), and there is no Kubernetes. How each part of the pod spec maps:
- readOnlyRootFilesystem: the root filesystem remounted read-only once the volumes
  are mounted (a runtime makes their mount points in the container's own layer;
  here they are made in the test's copy of the root filesystem);
- capabilities: `--cap-drop ALL` and a `--cap-add` for each one added that this
  host's bounding set holds (this VM's lacks CAP_SYS_RESOURCE, which the agent needs
  only on kernels before 5.11; given one it lacks, bwrap keeps every capability);
- hostNetwork: the namespace the caller runs bwrap in (a lab node's: `ip netns exec`);
  hostPID: no pid namespace of its own, /proc of the host's;
- /sys read-only and /dev a fresh devtmpfs-like tree, as runtimes give a container
  that is not privileged;
- hostPath volumes: bound from the host, read-only where the mount says so; the
  writable ones (markers, spool) from a test directory instead of the host path;
- configMap volumes: the ConfigMap's data written to a directory, bound read-only;
- env: the fieldRef spec.nodeName is the lab node's name; nothing else inherited.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.kernel import Capability, capability_set

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _objects() -> list[dict]:
    out = []
    for path in sorted(BASE.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


@dataclass(frozen=True)
class AgentPod:
    spec: dict               # the DaemonSet's pod spec
    container: dict          # its agent container
    config_maps: dict        # name -> data

    @property
    def capabilities(self) -> list[str]:
        return list(self.container["securityContext"]["capabilities"].get("add", []))

    def init_container(self, name: str) -> "AgentPod":
        """The same pod, running its init container `name` instead."""
        (found,) = [c for c in self.spec.get("initContainers", []) if c["name"] == name]
        return dataclasses.replace(self, container=found)

    def granted(self, drop: str | None = None) -> list[str]:
        """The capabilities the container gets here: the manifest's, less `drop` and
        those this host cannot grant."""
        bounding = capability_set("CapBnd")
        return [c for c in self.capabilities
                if c != drop and bounding >> Capability[c] & 1]

    def argv(self, rootfs: Path, workdir: Path, node: str, *extra_args: str,
             drop: str | None = None) -> list[str]:
        """bwrap's argv for the container, with `drop` left out of its
        capabilities; extra_args after the manifest's args."""
        sc = self.container["securityContext"]
        assert not sc.get("privileged") and sc["capabilities"]["drop"] == ["ALL"]
        argv = ["bwrap", "--bind", str(rootfs), "/", "--dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys",
                "--die-with-parent", "--clearenv", "--setenv", "PATH", PATH, "--cap-drop", "ALL"]
        if not self.spec.get("hostPID"):
            argv.append("--unshare-pid")
        assert self.spec.get("hostNetwork"), "the caller puts bwrap in the node's network"
        for cap in self.granted(drop):
            argv += ["--cap-add", f"CAP_{cap}"]
        volumes = {v["name"]: v for v in self.spec["volumes"]}
        for mount in self.container["volumeMounts"]:
            volume, read_only = volumes[mount["name"]], mount.get("readOnly", False)
            if "configMap" in volume:
                source = workdir / "configmaps" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
                for key, text in self.config_maps[volume["configMap"]["name"]].items():
                    (source / key).write_text(text)
            elif read_only:
                source = Path(volume["hostPath"]["path"])
            else:
                source = workdir / "host" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            argv += ["--ro-bind" if read_only else "--bind", str(source), mount["mountPath"]]
        if sc.get("readOnlyRootFilesystem"):
            argv += ["--remount-ro", "/"]
        for env in self.container.get("env", []):
            if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                argv += ["--setenv", env["name"], node]
            else:
                argv += ["--setenv", env["name"], env["value"]]
        return [*argv, "--", *self.container["command"], *self.container.get("args", []),
                *extra_args]


def agent_pod() -> AgentPod:
    objects = _objects()
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"
             and o["metadata"]["name"] == "fabricscope-agent"]
    spec = ds["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "agent"]
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    return AgentPod(spec, container, maps)
