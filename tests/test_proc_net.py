"""The pure half of the port checks: reading ``/proc/net/tcp`` and ``/proc/net/tcp6`` rows.

A listener counts only if a connection to 127.0.0.1 would reach it (issue 33: a listener on
127.0.0.2 made every run on 127.0.0.1 of that port refuse).
"""
import ipaddress
import sys

import pytest

from distlab.rendezvous.loopback import accepting_uid, listeners, listening_uid, parse_endpoint


def v4(address: str, port: int) -> str:
    """``/proc/net/tcp``'s spelling of an IPv4 endpoint (the address in host byte order)."""
    raw = ipaddress.ip_address(address).packed
    return f"{int.from_bytes(raw, sys.byteorder):08X}:{port:04X}"


def v6(address: str, port: int) -> str:
    """``/proc/net/tcp6``'s spelling: four 32-bit words, each in host byte order."""
    raw = ipaddress.ip_address(address).packed
    return "".join(f"{int.from_bytes(raw[i:i + 4], sys.byteorder):08X}" for i in range(0, 16, 4)) + f":{port:04X}"


def row(local: str, remote: str, state: str, uid: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 1 1 0"


def test_endpoints_are_read_in_both_tables():
    assert parse_endpoint("0100007F:3039" if sys.byteorder == "little" else "7F000001:3039") == (
        ipaddress.ip_address("127.0.0.1"), 12345)
    assert parse_endpoint(v6("::ffff:127.0.0.1", 80)) == (ipaddress.ip_address("::ffff:127.0.0.1"), 80)
    assert parse_endpoint(v6("::1", 80)) == (ipaddress.ip_address("::1"), 80)


@pytest.mark.parametrize("local, answers", [
    (v4("127.0.0.1", 4000), True), (v4("0.0.0.0", 4000), True), (v6("::", 4000), True),
    (v6("::ffff:127.0.0.1", 4000), True),
    (v4("127.0.0.2", 4000), False), (v4("127.0.1.1", 4000), False), (v4("10.0.0.5", 4000), False),
    (v6("::1", 4000), False), (v4("127.0.0.1", 4001), False),
])
def test_only_a_listener_that_answers_127_0_0_1_counts(local, answers):
    rows = [row(local, v4("0.0.0.0", 0), "0A", 1001)]
    assert listening_uid(rows, 4000) == (1001 if answers else None)


def test_the_listener_that_answers_is_found_among_others_on_the_port():
    rows = [row(v4("127.0.0.2", 4000), v4("0.0.0.0", 0), "0A", 1001),
            row(v4("127.0.0.1", 4000), v4("127.0.0.1", 5000), "01", 1002),  # a connection, not a listener
            row(v4("127.0.0.1", 4000), v4("0.0.0.0", 0), "0A", 1003)]
    assert listening_uid(rows, 4000) == 1003


def test_the_accepting_end_of_our_connection_names_its_owner():
    server, client = (ipaddress.ip_address("127.0.0.1"), 4000), (ipaddress.ip_address("127.0.0.1"), 51000)
    rows = [row(v4("127.0.0.1", 4000), v4("0.0.0.0", 0), "0A", 1001),
            row(v4("127.0.0.1", 51000), v4("127.0.0.1", 4000), "01", 0),  # our own end
            row(v4("127.0.0.1", 4000), v4("127.0.0.1", 51001), "01", 1004),  # someone else's connection
            row(v4("127.0.0.1", 4000), v4("127.0.0.1", 51000), "01", 1005)]
    assert accepting_uid(rows, server, client) == 1005
    v6rows = [row(v6("::ffff:127.0.0.1", 4000), v6("::ffff:127.0.0.1", 51000), "01", 1006)]
    assert accepting_uid(v6rows, server, client) == 1006  # a v6 listener took a v4 connection
    assert accepting_uid(rows[:3], server, client) is None
    closing = [row(v4("127.0.0.1", 4000), v4("127.0.0.1", 51000), "04", 1007)]  # accepted, then closed at once
    assert accepting_uid(closing, server, client) == 1007
    assert accepting_uid([row(v4("127.0.0.1", 4000), v4("127.0.0.1", 51000), "06", 0)], server, client) is None


def test_the_sockets_a_bind_to_127_0_0_1_collides_with_come_with_their_inode():
    rows = [row(v4("127.0.0.2", 4000), v4("0.0.0.0", 0), "0A", 1001),
            row(v6("::", 4000), v6("::", 0), "0A", 1002).replace(" 1 1 0", " 777 1 0")]
    assert listeners(rows, 4000) == [(1002, 777)]
