"""fabricscope.spool.DirSpool: durable entries, crash leftovers, corruption, cap, lock."""

from __future__ import annotations

import pytest

from fabricscope.errors import UserError
from fabricscope.spool import DirSpool, SpoolCorrupt, SpoolFull


def opened(path, max_bytes=1 << 20) -> DirSpool:
    spool = DirSpool(path, max_bytes)
    spool.open()
    return spool


def test_entries_survive_a_reopen_in_key_order(tmp_path):
    spool = opened(tmp_path)
    for key, payload in ((3, b"three"), (1, b"one"), (2, b"")):
        spool.append(key, payload, count=key * 10)
    assert (len(spool), spool.bytes, spool.next_key()) == (3, 8, 4)
    spool.close()
    again = opened(tmp_path)
    entries = again.entries()
    assert [(e.key, e.count, e.size) for e in entries] == [(1, 10, 3), (2, 20, 0), (3, 30, 5)]
    assert [again.read(e) for e in entries] == [b"one", b"", b"three"]
    assert again.remove(entries[0]) and not again.remove(entries[0])
    assert (len(again), again.bytes) == (2, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".lock", "00000000000000000002-20.spool", "00000000000000000003-30.spool"]


def test_a_write_cut_short_by_a_crash_leaves_nothing_but_a_tmp_file(tmp_path):
    opened(tmp_path).close()
    (tmp_path / "00000000000000000007-5.spool.tmp").write_bytes(b"FSP1 half")
    (tmp_path / "notes.spool").write_bytes(b"x")
    spool = opened(tmp_path)
    assert spool.entries() == [] and not list(tmp_path.glob("*.tmp"))
    assert [p.name for p in spool.unreadable] == ["notes.spool"]


@pytest.mark.parametrize("damage", [
    lambda data: data[:-1],                               # truncated payload
    lambda data: data[:4] + b"\0" + data[5:],             # checksum
    lambda data: b"XXXX" + data[4:],                      # magic
    lambda data: data[:6],                                # truncated header
])
def test_damaged_entries_are_detected(tmp_path, damage):
    spool = opened(tmp_path)
    entry = spool.append(1, b"payload bytes", 4)
    entry.path.write_bytes(damage(entry.path.read_bytes()))
    with pytest.raises(SpoolCorrupt, match="00000000000000000001-4.spool"):
        spool.read(entry)


def test_the_cap_is_checked_before_writing(tmp_path):
    spool = opened(tmp_path, max_bytes=10)
    spool.append(1, b"12345678", 1)
    with pytest.raises(SpoolFull):
        spool.append(2, b"123", 1)
    assert (len(spool), spool.bytes) == (1, 8)
    spool.append(3, b"12", 1)
    with pytest.raises(ValueError, match="exists"):
        spool.append(3, b"", 1)


def test_one_process_per_directory(tmp_path):
    first = opened(tmp_path)
    with pytest.raises(UserError, match="in use by another process"):
        opened(tmp_path)
    first.close()
    opened(tmp_path).close()


def test_unusable_directory_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot use spool directory"):
        opened(tmp_path / "file" / "sub")
