"""Line rates from sysfs (no root): a temp dir shaped like /sys, devices and links as
the kernel lays them out (class/net/IF -> devices/.../net/IF; `device` only under
hardware; bonds and VLANs with lower_* links and DEVTYPE in uevent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes.nic.settings import LinkSpeeds, SpeedSource, from_config

PCI = "devices/pci0000:00/0000:00:03.0"


class Sysfs:
    def __init__(self, root: Path):
        self.root = root
        self.net = root / "class" / "net"
        self.net.mkdir(parents=True)

    def _link(self, name: str, where: str, speed: str | None, uevent: str) -> Path:
        d = self.root / where / "net" / name
        d.mkdir(parents=True)
        if speed is not None:             # loopback, dummy: reading it fails (EINVAL)
            (d / "speed").write_text(speed + "\n")
        (d / "uevent").write_text(f"{uevent}INTERFACE={name}\nIFINDEX=7\n")
        os.symlink(os.path.relpath(d, self.net), self.net / name)
        return d

    def hardware(self, name: str, speed: str, driver: str = "ixgbe", bus: str = PCI) -> None:
        dev = self.root / bus
        (self.root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        dev.mkdir(parents=True, exist_ok=True)
        if not (dev / "driver").exists():
            os.symlink(os.path.relpath(self.root / "bus/pci/drivers" / driver, dev), dev / "driver")
        d = self._link(name, bus, speed, "")
        os.symlink(os.path.relpath(dev, d), d / "device")

    def virtual(self, name: str, speed: str | None, devtype: str = "",
                lowers: tuple[str, ...] = ()) -> None:
        d = self._link(name, "devices/virtual", speed,
                       f"DEVTYPE={devtype}\n" if devtype else "")
        for lower in lowers:
            os.symlink(os.path.relpath((self.net / lower).resolve(), d), d / f"lower_{lower}")

    def speeds(self, *entries: str) -> LinkSpeeds:
        parsed = LinkSpeeds.parse(list(entries))
        return LinkSpeeds(parsed.overrides, parsed.default_bps, self.net)


@pytest.fixture
def sysfs(tmp_path) -> Sysfs:
    s = Sysfs(tmp_path)
    s.hardware("eth0", "25000")
    s.hardware("eth1", "25000", bus="devices/pci0000:00/0000:00:04.0")
    s.hardware("ens5", "-1", driver="virtio_net", bus="devices/pci0000:00/0000:00:05.0/virtio2")
    s.virtual("veth0", "10000")                   # veth: ethtool's fixed 10000
    s.virtual("br0", "10000", devtype="bridge", lowers=("veth0",))
    s.virtual("tap0", "10")                       # tun/tap: SPEED_10
    s.virtual("lo", None)
    s.virtual("dummy0", None)
    s.virtual("bond0", "50000", devtype="bond", lowers=("eth0", "eth1"))
    s.virtual("eth0.100", "25000", devtype="vlan", lowers=("eth0",))
    s.virtual("veth0.7", "10000", devtype="vlan", lowers=("veth0",))
    return s


def test_a_nic_with_hardware_under_it_has_the_kernels_speed(sysfs):
    rate = sysfs.speeds().line_rate("eth0")
    assert (rate.bps, rate.source) == (25 * 10**9, SpeedSource.KERNEL)


@pytest.mark.parametrize("name", ["veth0", "br0", "tap0", "lo", "dummy0", "veth0.7"])
def test_a_virtual_link_has_no_line_rate_whatever_the_kernel_reports(sysfs, name):
    rate = sysfs.speeds().line_rate(name)
    assert (rate.bps, rate.source) == (None, SpeedSource.UNKNOWN)


def test_hardware_that_reports_no_speed_has_none(sysfs):
    assert sysfs.speeds().line_rate("ens5").source is SpeedSource.UNKNOWN


def test_bonds_and_vlans_on_hardware_keep_the_speed_the_kernel_derives(sysfs):
    speeds = sysfs.speeds()
    assert speeds.line_rate("bond0").bps == 50 * 10**9
    assert speeds.line_rate("eth0.100").bps == 25 * 10**9


def test_configured_rates_apply_to_virtual_links(sysfs):
    speeds = sysfs.speeds("veth0=1gbit", "40gbit")
    assert (speeds.line_rate("veth0").bps, speeds.line_rate("veth0").source) == \
        (10**9, SpeedSource.CONFIG)
    assert (speeds.line_rate("br0").bps, speeds.line_rate("br0").source) == \
        (40 * 10**9, SpeedSource.CONFIG_DEFAULT)
    assert speeds.line_rate("eth0").source is SpeedSource.KERNEL     # its own beats the default
    assert speeds.line_rate("ens5").source is SpeedSource.CONFIG_DEFAULT


def test_an_interface_that_does_not_exist_has_no_line_rate(sysfs):
    assert sysfs.speeds().line_rate("nope").bps is None


def test_a_lab_port_given_its_rate_on_the_command_line_has_it():
    s = from_config(AgentConfig(link_speed_bps=["eth0=1gbit"]))
    assert s.speeds.line_rate("eth0").bps == 10**9
