"""The FaultProxy the network-fault tests break links with (testbed/harness/tcp_proxy.py):
each fault does to a real TCP client what it says, in front of an echo server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from testbed.harness.tcp_proxy import FaultProxy, fault_proxy

QUIET = 0.3  # seconds in which nothing must arrive


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        async with fault_proxy("127.0.0.1", server.sockets[0].getsockname()[1]) as started:
            yield started
    finally:
        server.close()
        await server.wait_closed()


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def connect(proxy: FaultProxy) -> AsyncIterator[Callable[[], Awaitable[Stream]]]:
    """Opens client connections to the proxy; closes them all at the end."""
    opened: list[asyncio.StreamWriter] = []

    async def opener() -> Stream:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        opened.append(writer)
        return reader, writer

    yield opener
    for writer in opened:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def silent(reader: asyncio.StreamReader, size: int) -> asyncio.Task[bytes]:
    """A read of `size` bytes that nothing answers for QUIET seconds; the test awaits it
    later (once the fault heals)."""
    read = asyncio.create_task(reader.readexactly(size))
    done, _ = await asyncio.wait({read}, timeout=QUIET)
    assert not done, read.result()
    return read


async def roundtrip(stream: Stream, data: bytes) -> bytes:
    reader, writer = stream
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), 5)


async def test_a_stall_holds_the_bytes_and_a_heal_delivers_them(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    stream = await connect()
    assert await roundtrip(stream, b"before") == b"before"
    proxy.stall()
    stream[1].write(b"during")
    late = await connect()  # accepted, but held too
    read = await silent(stream[0], 6)
    assert proxy.held == 1
    proxy.heal()
    assert await asyncio.wait_for(read, 5) == b"during"  # nothing lost
    assert await roundtrip(late, b"new") == b"new"


async def test_a_reset_ends_open_connections_with_an_rst(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    stream = await connect()
    assert await roundtrip(stream, b"x") == b"x"
    proxy.reset()
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(stream[0].read(1), 5)
    assert await roundtrip(await connect(), b"next") == b"next"  # new ones go through


async def test_a_refusal_resets_new_connections_until_healed(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    proxy.refuse()
    reader, _ = await connect()
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), 5)
    assert proxy.refused == 1
    proxy.heal()
    assert await roundtrip(await connect(), b"back") == b"back"


async def test_a_black_hole_silences_open_connections_for_good(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    old = await connect()
    assert await roundtrip(old, b"x") == b"x"
    proxy.blackhole()
    old[1].write(b"lost")
    assert await roundtrip(await connect(), b"new") == b"new"
    proxy.heal()
    (await silent(old[0], 4)).cancel()  # no answer, no reset: silence


async def test_a_delay_forwards_each_chunk_late(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    stream = await connect()
    proxy.delay(0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await roundtrip(stream, b"slow") == b"slow"
    assert loop.time() - started >= 0.4  # both ways


async def test_a_trigger_breaks_the_link_before_its_chunk_is_forwarded(
    proxy: FaultProxy, connect: Callable[[], Awaitable[Stream]]
) -> None:
    stream = await connect()
    fired = proxy.when_sent(b"MARK", proxy.stall)
    assert await roundtrip(stream, b"MA") == b"MA"  # half a pattern: nothing yet
    stream[1].write(b"RK and more")
    await asyncio.wait_for(fired.wait(), 5)  # found across two chunks
    read = await silent(stream[0], 11)
    proxy.heal()
    assert await asyncio.wait_for(read, 5) == b"RK and more"
