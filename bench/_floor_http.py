"""The floor under GET /metrics: a trio server (the daemon's own library, loop and interpreter)
answering every connection with the same bytes, read once from a file, and nothing else. A bench
fetches from it the way it fetches from mokkafs, so what is above it is mokkafs's own.

    python _floor_http.py BODY_FILE READY_FD   (prints nothing; writes the port to READY_FD)
"""
from __future__ import annotations

import os
import sys

import trio


def main() -> None:
    body = open(sys.argv[1], "rb").read()
    reply = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n"
             "Connection: close\r\n\r\n").encode() + body

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(65536)  # the request: one read, as small clients send it whole
            await stream.send_all(reply)

    async def serve() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        os.write(int(sys.argv[2]), f"{listeners[0].socket.getsockname()[1]}\n".encode())
        await trio.serve_listeners(answer, listeners)

    trio.run(serve)


if __name__ == "__main__":
    main()
