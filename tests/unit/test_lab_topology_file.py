"""fabricscope.topology: the node -> ToR file the lab writes and the collector reads."""

import pytest

from fabricscope.errors import UserError
from fabricscope.topology import Topology, load_topology, parse_topology, write_topology

EXAMPLE = """\
# fabricscope topology: which top-of-rack switch each node hangs off
# (production: generated from node labels, e.g. topology.kubernetes.io/rack)
tors: [tor0, tor1]
nodes:
  node0: {tor: tor0}
  node1: {tor: tor0}
  node2: {tor: tor1}
"""


def test_the_written_file_is_the_documented_format_and_reads_back(tmp_path):
    topo = Topology(tors=("tor0", "tor1"), nodes={"node0": "tor0", "node1": "tor0",
                                                  "node2": "tor1"})
    assert topo.to_yaml() == EXAMPLE
    path = tmp_path / "topology.yaml"
    write_topology(topo, path)
    assert path.read_text() == EXAMPLE and list(tmp_path.iterdir()) == [path]
    again = load_topology(path)
    assert again == topo
    assert again.tor_of("node2") == "tor1" and again.tor_of("node9") is None
    assert again.nodes_of("tor0") == ("node0", "node1") and again.nodes_of("tor7") == ()


def test_names_yaml_would_misread_are_quoted_and_read_back_as_strings():
    topo = Topology(tors=("1", "true"), nodes={"yes": "1", "gpu-07.rack.example": "true",
                                               "null": "true"})
    assert parse_topology(topo.to_yaml()) == topo


def test_a_tor_without_nodes_and_a_file_without_nodes_are_fine():
    assert parse_topology("tors: [a, b]\nnodes:\n  n: {tor: a}\n").nodes_of("b") == ()
    assert parse_topology("tors: [a]\n") == Topology(tors=("a",))


@pytest.mark.parametrize("text,cause", [
    ("tors: [a\n", "not valid YAML at line 2"),
    ("- a\n- b\n", "must be a mapping"),
    ("", "must be a mapping"),
    ("tors: [a]\nracks: {}\n", "unknown key 'racks'"),
    ("nodes: {}\n", "`tors` must be a non-empty list"),
    ("tors: []\n", "`tors` must be a non-empty list"),
    ("tors: a\n", "`tors` must be a non-empty list"),
    ("tors: [1, 2]\n", "ToR name 1 is not a string (quote it)"),
    ("tors: [a, a]\n", "ToR 'a' is listed twice"),
    ("tors: [a]\nnodes: [n]\n", "`nodes` must map"),
    ("tors: [a]\nnodes:\n  n: a\n", "node 'n' must be given as {tor: NAME}"),
    ("tors: [a]\nnodes:\n  n: {tor: a, rack: 3}\n", "node 'n' must be given as {tor: NAME}"),
    ("tors: [a]\nnodes:\n  n: {tor: b}\n", "node 'n' hangs off 'b', which `tors` does not list"),
    ("tors: [a]\nnodes:\n  7: {tor: a}\n", "node name 7 is not a string"),
])
def test_bad_files_are_one_line_user_errors(tmp_path, text, cause):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_topology(path)
    line = err.value.one_line()
    assert line.startswith(f"fabricscope: error: {path}: ") and cause in line, line
    assert "\n" not in line and "fix: write it as: tors: [tor0]" in line


def test_a_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as err:
        load_topology(tmp_path / "none.yaml")
    assert "cannot read topology file" in err.value.cause
    assert "No such file" in err.value.cause and "topology_file" in err.value.fix
