"""fabricscope.lab.naming and fabricscope.lab.units: names, addresses, subnet allocation, tc-style units (no root)."""

import ipaddress

import pytest

from fabricscope.errors import UserError
from fabricscope.lab import naming
from fabricscope.lab.units import format_rate, parse_rate, parse_size, parse_time


def test_derived_names_are_short_unique_and_stable():
    assert naming.lab_hash("demo") == naming.lab_hash("demo")
    assert naming.lab_hash("demo") != naming.lab_hash("demo2")
    h = naming.lab_hash("demo")
    assert len(h) == 6 and int(h, 16) >= 0
    assert naming.bridge_name("demo") == f"fs{h}br"
    assert naming.port_name("demo", 3) == f"fs{h}p3"
    assert naming.node_ifname("demo", 3) == f"fs{h}n3"
    assert naming.netns_name("demo", 3) == "fs-demo-n3"
    assert naming.nft_table("demo") == f"fabricscope_{h}"
    assert naming.node_name("demo", 3) == "node3"
    longest = "x" * 32
    for ifname in (naming.bridge_name(longest), naming.port_name(longest, naming.MAX_NODES - 1),
                   naming.node_ifname(longest, naming.MAX_NODES - 1)):
        assert len(ifname) <= 15 and naming.IFNAME_RE.match(ifname)
    assert naming.NETNS_RE.match(naming.netns_name(longest, 63))
    assert naming.NFT_TABLE_RE.match(naming.nft_table(longest))


def test_macs_are_locally_administered_and_distinct():
    macs = {naming.mac("demo", i, side) for i in range(4) for side in ("node", "port")}
    macs.add(naming.mac("demo", 0, "bridge"))
    assert len(macs) == 9
    for m in macs:
        first = int(m.split(":")[0], 16)
        assert first & 0x02 and not first & 0x01      # local, unicast


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "x" * 33, "é", None, 3])
def test_bad_lab_names_are_user_errors(name):
    with pytest.raises(UserError):
        naming.check_name(name)


@pytest.mark.parametrize("nodes", [0, -1, naming.MAX_NODES + 1, True, 2.0, "2"])
def test_bad_node_counts_are_user_errors(nodes):
    with pytest.raises(UserError):
        naming.check_nodes(nodes)


def test_subnet_allocation_skips_used_and_overlapping_networks():
    assert str(naming.allocate_subnet([])) == "198.18.0.0/24"
    assert str(naming.allocate_subnet(["198.18.0.0/24", "198.18.1.0/24"])) == "198.18.2.0/24"
    # a host address inside 198.18.0.0/16 blocks the whole 198.18.x range
    assert str(naming.allocate_subnet(["198.18.7.9/16"])) == "198.19.0.0/24"
    assert str(naming.allocate_subnet(["10.0.0.1/8", "::1/128"])) == "198.18.0.0/24"
    every = [str(n) for n in naming.all_subnets()]
    assert len(every) == 512
    with pytest.raises(UserError):
        naming.allocate_subnet(every)


def test_addresses_in_a_subnet():
    net = ipaddress.ip_network("198.18.5.0/24")
    assert naming.node_address(net, 0) == "198.18.5.1"
    assert naming.node_address(net, 63) == "198.18.5.64"
    assert naming.gateway_address(net) == "198.18.5.254"


def test_paths_follow_the_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    assert naming.state_file("demo") == f"{tmp_path}/demo.json"
    assert naming.markers_dir("demo", 2) == f"{tmp_path}/demo/node2/markers"
    monkeypatch.delenv("FABRICSCOPE_LAB_DIR")
    assert naming.markers_dir("demo", 2) == "/run/fabricscope/labs/demo/node2/markers"


def test_cpu_masks():
    assert [naming.cpu_mask(n) for n in (1, 2, 8, 32, 33)] == \
        ["1", "3", "ff", "ffffffff", "1,ffffffff"]


@pytest.mark.parametrize("text,bps", [
    ("1gbit", 10**9), ("100mbit", 10**8), ("1.5Gbit", 1_500_000_000), ("500kbit", 500_000),
    ("1mibit", 2**20), ("1000", 1000), ("10bit", 10), ("1mbps", 8 * 10**6), ("2KiBps", 16384),
    (" 40gbit ", 40 * 10**9), (10**9, 10**9),
])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["", "fast", "1zbit", "-1gbit", "0mbit", "1 g bit", "gbit",
                                  True, 0])
def test_bad_rates_are_user_errors(text):
    with pytest.raises(UserError) as err:
        parse_rate(text)
    assert "\n" not in err.value.one_line()


@pytest.mark.parametrize("text,size", [
    ("32kb", 32768), ("32k", 32768), ("1500", 1500), ("1500b", 1500), ("1mb", 2**20),
    ("8kbit", 1024), ("2KiB", 2048),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text,seconds", [("5ms", 0.005), ("200us", 0.0002), ("1s", 1.0),
                                          ("1500", 0.0015), (0.25, 0.25)])
def test_parse_time(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


def test_format_rate():
    assert [format_rate(v) for v in (None, 10**9, 1_500_000_000, 100 * 10**6, 999)] == \
        ["-", "1gbit", "1.5gbit", "100mbit", "999bit"]
