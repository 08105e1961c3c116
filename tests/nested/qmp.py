#!/usr/bin/env python3
"""Sends human-monitor commands to a running qemu over its QMP socket.

    qmp.py SOCKET [--timeout S] [--every S] CMD...

Each CMD is one HMP command line ("info registers -a", "sendkey alt-sysrq-t",
"nmi"); its reply is printed under a "(qemu) CMD" header. A qemu that does not
answer within the timeout (its main loop stuck) is said so and the rest are
skipped: this runs when an L1 has frozen, and must never hang itself.
With --every, the commands are sent again every S seconds, quietly, until
qemu goes away (waiting up to a minute for its socket to appear first).
Exit status: 0 when every command was answered, 1 otherwise.
"""

import json
import socket
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    timeout = 5.0
    every = None
    while len(args) >= 3 and args[1] in ("--timeout", "--every"):
        if args[1] == "--timeout":
            timeout = float(args[2])
        else:
            every = float(args[2])
        del args[1:3]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path, commands = args[0], args[1:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    buf = b""

    def reply() -> dict:
        nonlocal buf
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "return" in msg or "error" in msg or "QMP" in msg:
                    return msg
                # an asynchronous event: not a reply
            if time.monotonic() > deadline:
                raise TimeoutError
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("qemu closed its monitor")
            buf += chunk

    def send(obj: dict) -> dict:
        s.sendall(json.dumps(obj).encode() + b"\n")
        return reply()

    if every is not None:
        # (qemu creates its socket as it starts)
        for _ in range(600):
            try:
                s.connect(path)
                break
            except OSError:
                time.sleep(0.1)
        else:
            return 1
    try:
        if every is None:
            s.connect(path)
        reply()  # the greeting
        send({"execute": "qmp_capabilities"})
    except (OSError, ValueError, TimeoutError, ConnectionError) as e:
        print(f"(qemu) monitor at {path} did not answer: {e!r}")
        return 1
    while every is not None:
        try:
            for cmd in commands:
                send({"execute": "human-monitor-command", "arguments": {"command-line": cmd}})
        except (OSError, ValueError, TimeoutError, ConnectionError):
            return 0  # qemu is gone (or stuck: the freeze report's business)
        time.sleep(every)
    for cmd in commands:
        print(f"(qemu) {cmd}")
        try:
            r = send({"execute": "human-monitor-command", "arguments": {"command-line": cmd}})
        except (OSError, ValueError, TimeoutError, ConnectionError) as e:
            print(f"  no answer within {timeout:g} s ({e!r}); qemu's main loop is stuck")
            return 1
        out = r.get("return", r.get("error"))
        print(out if isinstance(out, str) else json.dumps(out), end="" if isinstance(out, str) else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
