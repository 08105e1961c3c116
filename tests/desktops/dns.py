#!/usr/bin/env python3
"""A DNS responder for the desktop layouts (tests/desktops/run.sh): answers
A queries for the names in its table, NXDOMAIN for the rest, over UDP and
TCP on ADDR:53, in the network namespace the harness made. Loopback only.

    dns.py ADDR NAME=IPV4...
"""
import socket
import struct
import sys
import threading


def answer(query: bytes, table: dict) -> bytes:
    if len(query) < 12:
        return b""
    qid, flags, qd = struct.unpack(">HHH", query[:6])
    if qd != 1:
        return struct.pack(">HHHHHH", qid, 0x8001 | (flags & 0x0100), 0, 0, 0, 0)
    i, labels = 12, []
    while i < len(query) and query[i]:
        n = query[i]
        labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    i += 1
    if i + 4 > len(query):
        return b""
    qtype, _qclass = struct.unpack(">HH", query[i:i + 4])
    question = query[12:i + 4]
    name = ".".join(labels)
    ip = table.get(name)
    head = lambda rcode, an: struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, an, 0, 0)
    if ip is None:
        return head(3, 0) + question
    if qtype != 1:
        return head(0, 0) + question
    rr = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
    return head(0, 1) + question + rr


def serve_udp(addr, table):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(4096)
        r = answer(q, table)
        if r:
            s.sendto(r, peer)


def serve_tcp(addr, table):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 53))
    s.listen(16)
    while True:
        c, _ = s.accept()
        try:
            c.settimeout(5)
            n = struct.unpack(">H", c.recv(2))[0]
            q = b""
            while len(q) < n:
                part = c.recv(n - len(q))
                if not part:
                    break
                q += part
            r = answer(q, table)
            c.sendall(struct.pack(">H", len(r)) + r)
        except (OSError, struct.error):
            pass
        finally:
            c.close()


def main():
    addr = sys.argv[1]
    table = dict(a.split("=", 1) for a in sys.argv[2:])
    threading.Thread(target=serve_tcp, args=(addr, table), daemon=True).start()
    print("ready", flush=True)
    serve_udp(addr, table)


if __name__ == "__main__":
    main()
