"""Endpoint pickers' /metrics as a hostile tenant serves them, and an honest one, each on a pod's own IP:
`python -m tests.e2e.hostile_epp MODE:IP:PORT:POOL ...`, one server per argument, until killed. Run apart
from the test, so that the test's process measures only its own CPU.

Modes: `trickle` (the status line and headers one byte a second), `hang` (accepts, never answers),
`flood` (4 MiB of valid metrics, the queue gauge of its pool included), `large` (just under the operator's
1 MiB bound, valid: read and parsed every pass), `honest` (an EPP's gauge for its pool, the number of
waiting requests read from the file POOL.queue in the working directory at each request).
"""

from __future__ import annotations

import functools
import socket
import sys
import threading
import time
from pathlib import Path

GAUGE = "inference_extension_flow_control_queue_size"
OK_HEAD = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n"


def gauge(pool: str, fairness: str, value: int) -> bytes:
    labels = (
        f'fairness_id="{fairness}",inference_pool="{pool}",model_name="m",priority="0",target_model_name="m"'
    )
    return f"{GAUGE}{{{labels}}} {value}\n".encode()


def filler(size: int) -> bytes:
    """Valid metrics of other families, `size` bytes at most."""
    lines, total, i = [], 0, 0
    while True:
        line = b'stoker_e2e_filler_seconds_bucket{le="%d",path="/v1/completions"} %d\n' % (i, i)
        if total + len(line) > size:
            return b"".join(lines)
        lines.append(line)
        total += len(line)
        i += 1


@functools.cache
def fixed_answer(mode: str, pool: str) -> bytes:
    head = f"# TYPE {GAUGE} gauge\n".encode()
    if mode == "flood":
        return OK_HEAD + head + gauge(pool, "a", 1) + filler(4 * 1024 * 1024 - len(head) - 200)
    return OK_HEAD + head + gauge(pool, "a", 0) + filler(1000 * 1024)


def answer(mode: str, pool: str) -> bytes:
    if mode in ("flood", "large"):
        return fixed_answer(mode, pool)
    queued = Path(f"{pool}.queue")
    value = int(queued.read_text()) if queued.exists() else 0
    return OK_HEAD + f"# TYPE {GAUGE} gauge\n".encode() + gauge(pool, "a", value)


def serve_one(conn: socket.socket, mode: str, pool: str) -> None:
    with conn:
        try:
            conn.recv(4096)
            if mode == "hang":
                time.sleep(3600)
            elif mode == "trickle":
                for byte in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 3600:
                    conn.sendall(bytes([byte]))
                    time.sleep(1.0)
            else:
                conn.sendall(answer(mode, pool))
        except OSError:
            return


def serve(mode: str, ip: str, port: int, pool: str) -> None:
    listener = socket.create_server((ip, port), reuse_port=False)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_one, args=(conn, mode, pool), daemon=True).start()


def main(specs: list[str]) -> None:
    for spec in specs:
        mode, ip, port, pool = spec.split(":")
        threading.Thread(target=serve, args=(mode, ip, int(port), pool), daemon=True).start()
    print("serving", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
