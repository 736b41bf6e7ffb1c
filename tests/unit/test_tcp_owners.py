"""Flow ownership from a fake /proc tree: /proc/net/tcp{,6} -> inode -> pid -> owner."""

from __future__ import annotations

import os

import pytest

from fabricscope.agent.probes.tcp.owners import Owners, describe_process, parse_cgroup, parse_proc_net_tcp

# Real lines (this machine's /proc/net/tcp and tcp6 format; x86_64, little endian).
TCP = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   0: 0100007F:8577 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0  "
    "      0 155517 1 0000000021c9031c 100 0 0 10 0\n"
    "   1: 010012C6:9C40 020012C6:733C 01 00000000:00000000 00:00000000 00000000     0  "
    "      0 4242 1 0000000021c9031c 20 4 30 10 -1\n"
    "   2: 010012C6:9C41 020012C6:733C 06 00000000:00000000 03:00000000 00000000     0  "
    "      0 0 3 0000000021c9031c\n")
TCP6 = (
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0000000000000000FFFF0000030012C6:8C5B 0000000000000000FFFF0000040012C6:1F90 01 "
    "00000000:00000000 00:00000000 00000000     0        0 5151 1 00000000b36182dc 100 0 0 "
    "10 0\n"
    "   1: 000000FD000000000000000001000000:0050 000000FD000000000000000002000000:D431 01 "
    "00000000:00000000 00:00000000 00000000     0        0 6161 1 00000000b36182dc 100 0 0 "
    "10 0\n")

V4_FLOW = ("198.18.0.1", 40000, "198.18.0.2", 29500)
V6_FLOW = ("198.18.0.3", 35931, "198.18.0.4", 8080)


def test_proc_net_tcp_lines_map_flows_to_inodes():
    assert parse_proc_net_tcp(TCP) == {("127.0.0.1", 34167, "0.0.0.0", 0): 155517,
                                       V4_FLOW: 4242}         # TIME_WAIT (inode 0) left out
    got = parse_proc_net_tcp(TCP6)
    assert got[V6_FLOW] == 5151                               # v4-mapped shown as v4
    assert got[("fd00::1", 80, "fd00::2", 54321)] == 6161


@pytest.mark.parametrize("text,expected", [
    ("0::/user.slice/session-1.scope\n", ("/user.slice/session-1.scope", "")),
    ("0::/system.slice/docker-" + "ab" * 32 + ".scope\n",
     ("/system.slice/docker-" + "ab" * 32 + ".scope", "ab" * 6)),
    ("12:memory:/docker/" + "cd" * 32 + "\n0::/\n", ("/docker/" + "cd" * 32, "cd" * 6)),
    ("4:memory:/process_api/e4be4ada3b2092311cbabbf03658e52e\n1:cpu:/\n0::/\n",
     ("/process_api/e4be4ada3b2092311cbabbf03658e52e", "")),
    ("0::/\n", ("/", "")),
])
def test_cgroup_path_and_container(text, expected):
    assert parse_cgroup(text) == expected


def test_rank_and_job_come_from_the_environment_only_for_training_processes():
    env = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "198.18.0.1",
           "MASTER_PORT": "29500"}
    owner = describe_process(77, "python3", ("/", ""), env)
    assert owner.tags() == {"pid": "77", "comm": "python3", "cgroup": "/", "rank": "2",
                            "local_rank": "0", "world_size": "3", "job": "198.18.0.1:29500"}
    assert describe_process(5, "iperf3", ("", ""), {"PATH": "/bin"}).tags() == \
        {"pid": "5", "comm": "iperf3"}
    assert describe_process(5, "x", ("/", ""), {"FABRICSCOPE_JOB": "j1"}).job == "j1"


class FakeProc:
    """A /proc tree: net/tcp{,6}, PID/{comm,cgroup,environ,fd/N -> socket:[I]}, ns/net."""

    def __init__(self, root):
        self.root = root
        (root / "self" / "net").mkdir(parents=True)      # /proc/net -> self/net
        (root / "self" / "net" / "tcp").write_text(TCP)
        (root / "self" / "net" / "tcp6").write_text(TCP6)
        self.netns = root / "netns-inode"
        self.netns.write_text("")
        (root / "self" / "ns").mkdir()
        os.symlink(self.netns, root / "self" / "ns" / "net")

    def process(self, pid, comm, inodes, env=None):
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "ns").mkdir()
        os.symlink(self.netns, base / "ns" / "net")
        (base / "comm").write_text(comm + "\n")
        (base / "cgroup").write_text("0::/lab\n")
        (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode()
                                                  for k, v in (env or {}).items()) + b"\0")
        os.symlink("/dev/null", base / "fd" / "0")
        for n, inode in enumerate(inodes, 3):
            os.symlink(f"socket:[{inode}]", base / "fd" / str(n))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_owners_resolve_flows_to_the_process_holding_the_socket(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(10, "sshd", [155517])
    proc.process(20, "python3", [4242, 5151], {"RANK": "1", "FABRICSCOPE_JOB": "llm"})
    owners = Owners(proc=tmp_path, clock=Clock())
    found = owners.resolve([V4_FLOW, V6_FLOW])
    assert found[V4_FLOW].tags() == {"pid": "20", "comm": "python3", "cgroup": "/lab",
                                     "rank": "1", "job": "llm"}
    assert found[V6_FLOW].pid == 20
    assert owners.stats.resolved == 2 and owners.stats.scans == 1
    # cached: no second scan
    owners.resolve([V4_FLOW])
    assert owners.stats.scans == 1 and owners.get(V4_FLOW).pid == 20


def test_unknown_flows_rescan_at_most_once_per_interval_then_give_up(tmp_path):
    FakeProc(tmp_path)
    clock = Clock()
    owners = Owners(proc=tmp_path, clock=clock, rescan_s=1.0, max_attempts=2)
    unknown = ("198.18.0.9", 1, "198.18.0.8", 2)
    assert owners.resolve([unknown]) == {}
    assert owners.resolve([unknown]) == {}          # too soon: no scan
    assert owners.stats.scans == 1
    clock.now += 1.0
    owners.resolve([unknown])
    assert (owners.stats.scans, owners.stats.unresolved) == (2, 1)
    clock.now += 5.0
    owners.resolve([unknown])                        # given up: never scanned again
    assert owners.stats.scans == 2


def test_a_flow_seen_late_is_found_on_the_next_scan_and_forget_drops_it(tmp_path):
    proc = FakeProc(tmp_path)
    clock = Clock()
    owners = Owners(proc=tmp_path, clock=clock)
    assert owners.resolve([V4_FLOW]) == {}           # no process holds inode 4242 yet
    proc.process(30, "worker", [4242])
    clock.now += 1.0
    assert owners.resolve([V4_FLOW])[V4_FLOW].comm == "worker"
    owners.forget(V4_FLOW)
    assert owners.get(V4_FLOW) is None


def _flow_record(flow):
    from fabricscope.records import Record
    saddr, sport, daddr, dport = flow
    return Record("tcp_transfer", 1, {"saddr": saddr, "sport": str(sport), "daddr": daddr,
                                      "dport": str(dport), "side": "client"},
                  {"seconds": 0.0, "bytes_in": 1, "bytes_out": 0})


def test_records_of_a_new_flow_wait_for_the_next_scan_instead_of_leaving_untagged(tmp_path):
    from fabricscope.agent.probes.tcp.retransmit import OwnerTagger
    proc = FakeProc(tmp_path)
    clock = Clock()
    owners = Owners(proc=tmp_path, clock=clock)
    tagger = OwnerTagger(owners)
    owners.resolve([("198.18.0.9", 1, "198.18.0.8", 2)])        # a scan just ran
    assert tagger.tag([_flow_record(V4_FLOW)]) == [] and tagger.waiting == 1
    proc.process(30, "worker", [4242], {"RANK": "3", "FABRICSCOPE_JOB": "j"})
    assert tagger.tag([]) == []                                 # too soon to scan again
    clock.now += 1.0
    (rec,) = tagger.tag([])
    assert (rec.tags["pid"], rec.tags["rank"]) == ("30", "3") and tagger.waiting == 0


def test_a_record_is_released_untagged_after_one_scan_that_could_not_find_its_owner(tmp_path):
    from fabricscope.agent.probes.tcp.retransmit import OwnerTagger
    FakeProc(tmp_path)
    clock = Clock()
    owners = Owners(proc=tmp_path, clock=clock)
    tagger = OwnerTagger(owners)
    owners.resolve([("198.18.0.9", 1, "198.18.0.8", 2)])
    gone = ("198.18.0.7", 3, "198.18.0.6", 4)                   # its process already exited
    assert tagger.tag([_flow_record(gone)]) == []
    clock.now += 1.0
    (rec,) = tagger.tag([])
    assert "pid" not in rec.tags and tagger.flush() == []
    tagger.tag([])
    assert tagger.waiting == 0


def test_a_flow_closed_before_any_scan_gets_the_owner_the_kernel_saw_connect(tmp_path):
    """A short connection is gone from /proc/net/tcp by the next scan; the pid its
    connect() ran in (from the BPF open/transfer/close events) still names it."""
    proc = FakeProc(tmp_path)
    proc.process(40, "python3", [], {"RANK": "1", "FABRICSCOPE_JOB": "llm"})
    owners = Owners(proc=tmp_path, clock=Clock(), host_pids=True)
    short = ("198.18.0.2", 52838, "198.18.0.254", 35301)      # in no /proc/net/tcp line
    owners.learn(short, 40)
    assert owners.resolve([short])[short].tags() == {
        "pid": "40", "comm": "python3", "cgroup": "/lab", "rank": "1", "job": "llm"}
    assert (owners.stats.learned, owners.stats.scans) == (1, 0)
    owners.learn(short, 41)                                     # known: kept, not re-read
    assert owners.get(short).pid == 40 and owners.stats.learned == 1


def test_kernel_pids_are_ignored_when_they_may_name_other_processes(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(40, "python3", [])
    flow = ("198.18.0.2", 52838, "198.18.0.254", 35301)
    other_ns = Owners(proc=tmp_path, clock=Clock(), host_pids=False)
    other_ns.learn(flow, 40)
    assert other_ns.get(flow) is None and other_ns.pending(flow)
    undecided = Owners(proc=tmp_path, clock=Clock())           # the fake /proc's ns/pid:
    undecided.learn(flow, 40)                                   # missing, so not the host's
    assert undecided.host_pids is False and undecided.get(flow) is None
    gone = Owners(proc=tmp_path, clock=Clock(), host_pids=True)
    gone.learn(flow, 99)                                        # exited before the poll
    assert gone.get(flow) is None and gone.pending(flow) and gone.stats.learned == 0


def test_a_process_read_after_it_exited_keeps_the_rank_another_probe_read_while_it_lived(
        tmp_path):
    """The gloo probe read the rank's environment while it ran; the TCP probe drained
    its flow only after it exited (a zombie: comm, stat and cgroup still there, environ
    unreadable). The shared Environments answer for it, by pid and start time; a later
    process with the same pid gets nothing from them."""
    from fabricscope.agent.probes.gloo.procs import ProcessTable
    from fabricscope.agent.procmaps import Environments
    proc = FakeProc(tmp_path)
    proc.process(20, "python", [4242], {"RANK": "1", "FABRICSCOPE_JOB": "llm"})
    stat = tmp_path / "20" / "stat"
    stat.write_text("20 (python) S " + " ".join(["0"] * 18) + " 5150 0\n")   # field 22
    clock = Clock()
    shared = Environments(clock=clock)
    gloo = ProcessTable(tmp_path, own_netns=os.stat(proc.netns).st_ino, environments=shared)
    assert gloo.get(20).rank == "1"
    (tmp_path / "20" / "environ").unlink()        # exited: reading it fails (ESRCH)
    owners = Owners(proc=tmp_path, clock=Clock(), environments=shared)
    assert owners.resolve([V4_FLOW])[V4_FLOW].tags()["rank"] == "1"
    assert shared.recalled == 1
    stat.write_text("20 (python) S " + " ".join(["0"] * 18) + " 9999 0\n")   # pid reused
    assert Owners(proc=tmp_path, clock=Clock(), environments=shared).resolve(
        [V4_FLOW])[V4_FLOW].rank == ""


def test_a_flow_learned_after_its_process_was_reaped_gets_the_rank_read_while_it_lived(
        tmp_path):
    """Nothing of the process is left in /proc; the pid it connected from still names
    it for RECALL_S after a probe read it, and nothing after that."""
    import shutil

    from fabricscope.agent.procmaps import Environments
    proc = FakeProc(tmp_path)
    proc.process(40, "python", [], {"RANK": "2", "FABRICSCOPE_JOB": "llm"})
    (tmp_path / "40" / "stat").write_text("40 (python) S " + " ".join(["0"] * 18) + " 77 0\n")
    clock = Clock()
    shared = Environments(clock=clock)
    assert shared.read(tmp_path / "40")["RANK"] == "2"
    shutil.rmtree(tmp_path / "40")                                           # reaped
    owners = Owners(proc=tmp_path, clock=clock, environments=shared, host_pids=True)
    short = ("198.18.0.2", 40000, "198.18.0.254", 9000)
    owners.learn(short, 40)
    assert owners.get(short).tags() == {"pid": "40", "rank": "2", "job": "llm"}
    clock.now += Environments.RECALL_S + 1
    later = ("198.18.0.2", 40001, "198.18.0.254", 9000)
    owners.learn(later, 40)
    assert owners.get(later) is None
