#!/usr/bin/env python3
"""A TCP proxy that adds a fixed round-trip time, for measuring a remote target as if the server
were across a network: each chunk is forwarded half the round trip after it arrived, in both
directions, without holding up the chunks behind it.

    scripts/delay-proxy.py --listen 127.0.0.1:30001 --upstream 127.0.0.1:30000 --rtt-ms 50
"""
import argparse
import queue
import socket
import threading
import time


def pump(src, dst, delay):
    """Read from src and write each chunk to dst `delay` seconds after it arrived."""
    chunks = queue.Queue()

    def writer():
        while True:
            due, data = chunks.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        chunks.put((time.monotonic() + delay, data or None))
        if not data:
            break
    w.join()


def handle(client, upstream, delay):
    try:
        server = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a = threading.Thread(target=pump, args=(client, server, delay), daemon=True)
    b = threading.Thread(target=pump, args=(server, client, delay), daemon=True)
    a.start()
    b.start()
    a.join()
    b.join()
    client.close()
    server.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:30001")
    p.add_argument("--upstream", default="127.0.0.1:30000")
    p.add_argument("--rtt-ms", type=float, default=50.0)
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    uhost, uport = args.upstream.rsplit(":", 1)
    listener = socket.create_server((host, int(port)))
    print(f"proxy on http://{args.listen} -> {args.upstream}, {args.rtt_ms} ms round trip", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=handle, args=(client, (uhost, int(uport)), args.rtt_ms / 2000.0), daemon=True).start()


if __name__ == "__main__":
    main()
