"""A TCP relay from inside a network namespace to the host's loopback.

The test API server listens on the host's 127.0.0.1 only; the node's processes live in their own
network namespace, where 127.0.0.1 is theirs. This relay opens its listening socket inside the
node's namespace (``setns`` on the one thread, then back), so kubelet, kube-proxy, the scheduler
and CoreDNS reach ``https://127.0.0.1:<port>`` there, and connects out from the host's namespace.
TLS passes through untouched (the API server's certificate names 127.0.0.1).

    python -m fleet_testing.node.relay NETNS_PATH LISTEN_PORT TARGET_PORT [LISTEN_ADDRESS]

The same relay, listening on the node's address, lets pods reach a host process that listens on
the host's loopback only (the control plane, for the registry fetch init container).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listener: socket.socket, target_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main() -> None:
    netns, listen_port, target_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    address = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    inside = os.open(netns, os.O_RDONLY)
    _setns(inside)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, listen_port))
    listener.listen(128)
    _setns(home)
    os.close(inside)
    print("ready", flush=True)
    asyncio.run(_serve(listener, target_port))


if __name__ == "__main__":
    main()
