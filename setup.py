"""One distribution, one top-level package: `fabricscope`.

The components keep their folders in the repository (agent/, collector/, lab/, ...)
and install as fabricscope.agent, fabricscope.collector, ...; the BPF sources in
bpf/ install as fabricscope/bpf, beside fabricscope/agent as in the checkout, so the
agent compiles its probes from the same relative place either way. Everything else
is in pyproject.toml; this file only lists packages, which setuptools' declarative
`packages.find` cannot map into one namespace."""

from setuptools import find_packages, setup

COMPONENTS = ("agent", "collector", "lab", "bench", "demo", "diagnosis", "surface")

packages = ["fabricscope", *(f"fabricscope.{p}" for p in find_packages("fabricscope"))]
package_dir = {"fabricscope": "fabricscope", "fabricscope.bpf": "bpf"}
for component in COMPONENTS:
    package_dir[f"fabricscope.{component}"] = component
    packages += [f"fabricscope.{component}",
                 *(f"fabricscope.{component}.{p}" for p in find_packages(component))]

setup(packages=[*packages, "fabricscope.bpf"], package_dir=package_dir,
      package_data={"fabricscope.bpf": ["*.c", "*.h"], "fabricscope.bench": ["*.c"]})
