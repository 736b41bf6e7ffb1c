"""The sweep's choice of sockets to ask sock_diag about, and of those to close."""

import numpy as np

from fabricscope.agent.probes.tcp.flow_layout import SOCK_DTYPE
from fabricscope.agent.probes.tcp.sweep import Sweeper

S = 1_000_000_000


def table(rows):
    """(keys, socks) of (sk, cookie, made_ns) rows."""
    socks = np.zeros(len(rows), dtype=SOCK_DTYPE)
    for i, (_, cookie, made) in enumerate(rows):
        socks["cookie"][i] = cookie
        socks["made_ns"][i] = made
    return np.array([r[0] for r in rows], dtype=np.uint64), socks


def test_only_entries_with_a_cookie_made_before_the_quiet_period_are_asked_about():
    keys, socks = table([(1, 11, 0), (2, 0, 0), (3, 13, 10 * S)])
    assert Sweeper(quiet_s=1.0).candidates(keys, socks, 10 * S + S // 2) == [0]


def test_gone_sockets_are_returned_with_their_cookie_and_the_living_rechecked_later():
    sweeper = Sweeper(quiet_s=1.0, recheck_s=10.0)
    keys, socks = table([(1, 11, 0), (2, 12, 0)])
    assert sweeper.gone(keys, socks, [0, 1], 5 * S, live={12}) == [(1, 11)]
    # the living one is not asked about again until recheck_s has passed
    keys, socks = table([(2, 12, 0)])
    assert sweeper.candidates(keys, socks, 14 * S) == []
    assert sweeper.candidates(keys, socks, 15 * S) == [0]
    assert sweeper.gone(keys, socks, [0], 15 * S, live=set()) == [(2, 12)]


def test_a_new_socket_at_a_known_address_is_asked_about_at_once():
    sweeper = Sweeper(quiet_s=1.0, recheck_s=10.0)
    keys, socks = table([(1, 11, 0)])
    assert sweeper.gone(keys, socks, [0], 5 * S, live={11}) == []
    keys, socks = table([(1, 21, 2 * S)])          # same address, another cookie
    assert sweeper.candidates(keys, socks, 6 * S) == [0]
    assert sweeper.gone(keys, socks, [0], 6 * S, live={21}) == []
    assert (1, 11) not in sweeper.alive_at          # forgotten: not in the table any more


def _diag_msg(cookie: int) -> bytes:
    from fabricscope.agent.probes.tcp.sweep import _NLMSG, SOCK_DIAG_BY_FAMILY
    body = bytes(44) + cookie.to_bytes(8, "little") + bytes(20)   # inet_diag_msg is 72 bytes
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, 2, 1, 0) + body


def test_cookies_are_read_from_each_message_until_done():
    from fabricscope.agent.probes.tcp.sweep import _NLMSG, NLMSG_DONE, parse_cookies
    out: set[int] = set()
    assert parse_cookies(_diag_msg(7) + _diag_msg(1 << 40), out) is False
    assert parse_cookies(_diag_msg(9) + _NLMSG.pack(20, NLMSG_DONE, 2, 1, 0) + bytes(4), out)
    assert out == {7, 1 << 40, 9}


def test_a_netlink_error_and_a_malformed_message_raise_oserror():
    import errno
    import struct

    import pytest

    from fabricscope.agent.probes.tcp.sweep import _NLMSG, NLMSG_ERROR, parse_cookies
    with pytest.raises(OSError) as err:
        parse_cookies(_NLMSG.pack(36, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -errno.ENOENT)
                      + bytes(16), set())
    assert err.value.errno == errno.ENOENT
    with pytest.raises(OSError):
        parse_cookies(_NLMSG.pack(4, 20, 0, 1, 0), set())


def test_the_sweep_is_due_every_every_s():
    sweeper = Sweeper(every_s=10.0)
    assert sweeper.due(5 * S)
    assert not sweeper.due(14 * S)
    assert sweeper.due(15 * S)
