"""The runtime's books of WebSockets (runtime.host.sockets): every count and size an isolate or a
client can push on is bounded, and what passes the bound closes the socket with the code and
reason a user can act on."""

from runtime.host.sockets import (
    INBOX_FRAMES,
    OUTBOX_BYTES,
    PER_OWNER,
    SocketHub,
    SocketOwner,
)
from runtime.isolate import ipc
from workers.websocket import ATTACHMENT_BYTES, MESSAGE_BYTES


async def _never(sock, event):  # the owner's events are not run here
    raise AssertionError("not delivered in these tests")


def _owner(hub=None, account="acct"):
    return SocketOwner(hub or SocketHub(), account, "w", _never)


def _attached(sock):
    """As the front's session leaves it: a client holds the socket (its close is delivered there)."""
    sock.client = "a client"
    return sock


def _closed_with(sock):
    kind, (code, reason) = sock.outbox[-1]
    assert kind == "close" and sock.closed
    return code, reason


def test_an_owner_holds_at_most_per_owner_sockets_and_only_new_ids():
    owner = _owner()
    for ws in range(1, PER_OWNER + 1):
        assert not isinstance(owner.open(ipc.SocketOffer(ws=ws), 1), str)
    assert "more than 64 WebSockets" in owner.open(ipc.SocketOffer(ws=999), 1)
    owner.sockets[1].close_by_worker(1000, "bye")
    assert not isinstance(owner.open(ipc.SocketOffer(ws=999), 1), str)  # room again
    assert "not a new one" in owner.open(ipc.SocketOffer(ws=2), 1)  # one already open
    assert "not a new one" in owner.open(ipc.SocketOffer(ws=0), 1)
    assert owner.next_id == 1000


def test_tags_and_attachments_are_bounded():
    owner = _owner()
    assert "tags" in owner.open(ipc.SocketOffer(ws=1, tags=["t"] * 11), 1)
    assert "tags" in owner.open(ipc.SocketOffer(ws=1, tags=["x" * 257]), 1)
    assert "serializeAttachment" in owner.open(ipc.SocketOffer(ws=1, attachment="x" * ATTACHMENT_BYTES), 1)
    sock = owner.open(ipc.SocketOffer(ws=1, tags=["chat"], attachment={"name": "a"}), 1)
    owner.from_isolate(ipc.SocketAttach(1, {"name": "b"}))
    assert sock.attachment == {"name": "b"}
    owner.from_isolate(ipc.SocketAttach(1, "y" * (ATTACHMENT_BYTES + 1)))
    assert _closed_with(sock)[0] == 1011


def test_a_client_that_does_not_read_is_cut_not_buffered():
    owner = _owner()
    sock = _attached(owner.open(ipc.SocketOffer(ws=1), 1))
    chunk = "x" * (64 * 1024)
    for _ in range(OUTBOX_BYTES // len(chunk)):
        sock.send(chunk, None)
    assert not sock.closed and sock.out_bytes == OUTBOX_BYTES
    sock.send(chunk, None)
    code, reason = _closed_with(sock)
    assert code == 1008 and "not reading" in reason
    assert sock.out_bytes == 0 and len(sock.outbox) == 1  # only the close waits
    event = sock.inbox[-1]  # the worker is told why, and the socket kept until it has been
    assert event.kind == "close" and event.code == 1008 and owner.sockets == {1: sock}


def test_a_flood_and_a_giant_message_from_a_client_are_cut():
    flood = _attached(_owner().open(ipc.SocketOffer(ws=1), 1))
    for _ in range(INBOX_FRAMES):
        flood.received("hi", None)
    assert not flood.closed
    flood.received("one more", None)
    code, reason = _closed_with(flood)
    assert code == 1008 and "faster than the worker reads" in reason
    assert [e.kind for e in flood.inbox] == ["close"]  # what waited is dropped; the close is told

    giant = _owner().open(ipc.SocketOffer(ws=1), 1)
    giant.received(None, b"x" * (MESSAGE_BYTES + 1))
    code, reason = _closed_with(giant)
    assert code == 1009 and "1 MiB" in reason


def test_an_accounts_sockets_are_counted_and_a_stopped_isolate_keeps_only_hibernatable_ones():
    hub = SocketHub()
    owner = _owner(hub)
    plain = owner.open(ipc.SocketOffer(ws=1), 1)
    kept = owner.open(ipc.SocketOffer(ws=2, tags=[], attachment=[1, 2]), 1)
    assert hub.count("acct") == 2
    assert owner.held() == [ipc.HeldSocket(2, [], [1, 2])]
    owner.isolate_gone()
    assert plain.closed and _closed_with(plain)[0] == 1012 and not kept.closed
    assert hub.count("acct") == 1 and list(owner.sockets) == [2]
    kept.cut(1011, "no client ever took it")  # never attached: no one to deliver a close, forgotten now
    assert owner.sockets == {} and hub.count("acct") == 0


def test_a_socket_passed_on_by_token_is_claimed_once_by_its_account_only():
    hub = SocketHub()
    sock = _owner(hub).open(ipc.SocketOffer(ws=1), 1)
    token = hub.offer(sock)
    assert hub.claim(token, "other") is None
    assert hub.claim(token, "acct") is sock
    assert hub.claim(token, "acct") is None
    assert hub.claim(12, "acct") is None


def test_a_client_gone_without_a_close_frame_is_an_error_for_the_worker():
    owner = _owner()
    clean = _attached(owner.open(ipc.SocketOffer(ws=1), 1))
    clean.client_left(1000, "bye")
    broken = _attached(owner.open(ipc.SocketOffer(ws=2), 1))
    broken.client_left(1006, "")
    assert [(e.kind, e.code) for e in (clean.inbox[-1], broken.inbox[-1])] == [
        ("close", 1000),
        ("error", 1006),
    ]
    assert set(owner.sockets) == {1, 2}  # kept until those events are delivered
