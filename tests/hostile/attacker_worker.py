"""The hostile worker: each path tries one escape and reports what happened."""

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
import time

from workers import Response, WorkerEntrypoint

BORN = secrets.token_hex(8)  # which isolate process answered
CANCELLED = []  # streams whose client went away


def _try(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return type(exc).__name__


def _spin():
    while True:
        pass


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[-1].split("?")[0]
        query = (
            dict(p.split("=", 1) for p in request.url.split("?", 1)[1].split("&"))
            if "?" in request.url
            else {}
        )
        if path == "born":
            return Response(BORN)
        if path == "sockets":
            kinds = {
                "packet": (socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)),
                "raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
                "udp": (socket.AF_INET, socket.SOCK_DGRAM, 0),
                "tcp6": (socket.AF_INET6, socket.SOCK_STREAM, 0),
                "netlink": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
            }
            return Response.json({k: _try(lambda a=a: socket.socket(*a).close()) for k, a in kinds.items()})
        if path == "signal":
            pids = [int(p) for p in query["pids"].split("-")]
            out = {str(pid): _try(lambda pid=pid: os.kill(pid, signal.SIGSTOP)) for pid in pids}
            out["parent"] = _try(lambda: os.kill(os.getppid(), signal.SIGKILL))
            out["everyone"] = _try(lambda: os.kill(-1, signal.SIGKILL))
            out["visible"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            return Response.json(out)
        if path == "fork-bomb":
            made = 0
            for _ in range(200):
                try:
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                    made += 1
                except OSError:
                    break
            os.kill(-1, signal.SIGKILL)  # clean up (every process in the namespace but itself)
            for _ in range(made):
                os.wait()
            return Response(str(made))
        if path == "fork-memory":
            for _ in range(10):
                if os.fork() == 0:  # each under the per-process cap, together far over it
                    try:
                        hoard = bytearray(60 * 1024 * 1024)
                        hoard[::4096] = b"x" * len(hoard[::4096])
                        time.sleep(60)
                    finally:
                        os._exit(0)
            await asyncio.sleep(30)
            return Response("the children were not stopped")
        if path == "fork-spin":
            if os.fork() == 0:
                try:
                    _spin()
                finally:
                    os._exit(0)
            return Response("forked")
        if path == "fork-then-die":
            if os.fork() == 0:
                try:
                    time.sleep(60)  # holds every inherited descriptor, the IPC socket included
                finally:
                    os._exit(0)
            os._exit(1)
        if path == "wait-until-spin":

            async def spin():
                _spin()

            self.ctx.waitUntil(spin())
            return Response("responded")
        if path == "stream-spin":

            async def body():
                yield b"first chunk\n"
                _spin()

            return Response(body())
        if path == "peek":
            try:
                with open(query["path"].replace("%2F", "/")) as f:
                    return Response(f.read()[:20])
            except OSError as exc:
                return Response(type(exc).__name__, status=403)
        if path == "flood":
            print("x" * (1024 * 1024))  # one 1 MB line through the tail
            for _ in range(5000):
                print("line " * 20)
            os.write(1, b"y" * (1024 * 1024))  # 1 MB on stdout without a newline
            for _ in range(200):
                os.write(2, b"z" * 64 * 1024 + b"\n")  # 12.8 MB of lines on stderr
            return Response("flooded")
        if path == "body":
            total = 0
            async for chunk in request.body:
                total += len(chunk)
            return Response(str(total))
        if path == "endless":

            async def body():
                try:
                    while True:
                        yield b"e" * 65536
                        await asyncio.sleep(0)
                finally:
                    CANCELLED.append(1)

            return Response(body())
        if path == "big-frame":  # write straight to the IPC socket: a frame header of 4 GB
            fd = int(sys.argv[sys.argv.index("--fd") + 1])
            os.write(fd, b"\xff\xff\xff\xff")
            await asyncio.sleep(30)
            return Response("the runtime read on")
        if path == "sync-garbage":  # not a BindingCall on the synchronous channel
            fd = int(sys.argv[sys.argv.index("--sync-fd") + 1])
            os.write(fd, b"\x00\x00\x00\x05hello")
            await asyncio.sleep(30)
            return Response("the runtime read on")
        if path == "cancelled":
            return Response(str(len(CANCELLED)))
        return Response(json.dumps({"unknown": path}), status=404)
