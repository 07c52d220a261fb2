"""A throttling TCP proxy on 127.0.0.1 for `bench_remote.py`: one shared bandwidth cap and a fixed latency.

Every byte from the server to the clients passes one token bucket (`--mbps`, all connections together: the
link), and every chunk in either direction is delivered `--latency-ms / 2` after it was sent, so a request
costs one round trip plus its bytes at the link's rate. A new connection costs one round trip more. It
counts the bytes sent down and the requests (lines starting with an HTTP method) and writes them, as JSON,
to `--stats` every 0.2 s and on exit.

    python tools/bench_remote_proxy.py --to 127.0.0.1:5000 --port 5001 --mbps 25 --latency-ms 100 --stats s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time

AHEAD_S = 0.01  # how far ahead of the link's schedule a reader may run
CHUNK = 1 << 18  # bytes read at once
METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class Link:
    """The shared cap (bytes/s) and the one-way delay; what went down it."""

    def __init__(self, mbps: float, latency_s: float):
        self.rate, self.one_way = mbps * 1e6, latency_s / 2
        self.next_free = 0.0
        self.down = self.up = self.requests = self.connections = 0

    async def through(self, n: int) -> float:
        """`n` bytes' turn on the link: the time their last byte leaves it (exact, by the cap), waiting only
        while the link is booked more than `AHEAD_S` ahead (a sleep per chunk would oversleep the cap away)."""
        now = time.monotonic()
        start = max(now, self.next_free)
        self.next_free = start + n / self.rate
        if self.next_free - now > AHEAD_S:
            await asyncio.sleep(self.next_free - now - AHEAD_S)
        return self.next_free


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link, down: bool) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await queue.get()
            if data is None:
                break
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            if down:
                sent = await link.through(len(data))
                link.down += len(data)
            else:
                sent = time.monotonic()
                link.up += len(data)
                link.requests += sum(data.startswith(m) or data.count(b"\r\n" + m) for m in METHODS)
            await queue.put((sent + link.one_way, data))
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        await queue.put((0.0, None))
        try:
            await task
        except (ConnectionError, OSError):
            pass


async def _serve(args: argparse.Namespace, link: Link) -> None:
    host, port = args.to.rsplit(":", 1)

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        link.connections += 1
        await asyncio.sleep(2 * link.one_way)  # the connection's handshake: one round trip
        try:
            sreader, swriter = await asyncio.open_connection(host, int(port))
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(_pump(creader, swriter, link, down=False), _pump(sreader, cwriter, link, down=True))

    server = await asyncio.start_server(handle, "127.0.0.1", args.port)

    async def stats() -> None:
        while True:
            _write_stats(args.stats, link)
            await asyncio.sleep(0.2)

    asyncio.create_task(stats())
    async with server:
        await server.serve_forever()


def _write_stats(path: str | None, link: Link) -> None:
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"down": link.down, "up": link.up, "requests": link.requests,
                       "connections": link.connections}, f)
        os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", required=True, help="host:port of the server behind the proxy")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mbps", type=float, default=25.0, help="the link's cap, MB/s (1e6 bytes)")
    ap.add_argument("--latency-ms", type=float, default=100.0, help="round trip")
    ap.add_argument("--stats", help="JSON file of the bytes and requests seen")
    args = ap.parse_args()
    link = Link(args.mbps, args.latency_ms / 1000)
    signal.signal(signal.SIGTERM, lambda *_: (_write_stats(args.stats, link), os._exit(0)))
    asyncio.run(_serve(args, link))


if __name__ == "__main__":
    main()
