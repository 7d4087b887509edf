"""The namespace holder of the hermetic GCS: run by ``tests/gcs/emulator.py`` as
``setpriv --pdeathsig=KILL unshare --net --mount python -S holder.py DIR EMULATOR_BINARY``.

Inside a fresh network namespace (only ``lo`` exists) and a private mount namespace it

1. brings ``lo`` up and bind-mounts ``DIR/hosts`` over ``/etc/hosts``, so that
   ``www.googleapis.com`` (TensorFlow's compiled-in endpoint), ``storage.googleapis.com``
   (tensorstore, google-cloud-storage) and ``oauth2.googleapis.com`` resolve to 127.0.0.1;
2. starts fake-gcs-server (plain HTTP on 127.0.0.1:4443, its objects under ``DIR/storage``),
   which dies with this process (``PR_SET_PDEATHSIG``);
3. serves the TLS front (``front.py``) on 127.0.0.1:443 and prints ``ready``.

Standard library only, so it starts in ~0.1 s. The processes under test join the namespace with
``nsenter``; nothing can leave the loopback. SIGTERM stops it (and so the emulator).
"""

from __future__ import annotations

import ctypes
import fcntl
import http.client
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from front import EMULATOR_PORT, Front  # this file's folder is on sys.path (python holder.py)


def _prctl_pdeathsig() -> None:
    """In a child: SIGKILL it when its parent dies (PR_SET_PDEATHSIG = 1)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _loopback_up() -> None:
    """``ip link set lo up`` without iproute2: SIOCGIFFLAGS, set IFF_UP, SIOCSIFFLAGS."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, request))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))


def _bind_mount(source: str, target: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, 4096, None):  # MS_BIND
        raise OSError(ctypes.get_errno(), f"bind-mounting {source} on {target}")


def _start_emulator(binary: str, root: str) -> subprocess.Popen:
    emulator = subprocess.Popen(
        [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(EMULATOR_PORT),
         "-backend", "filesystem", "-filesystem-root", root, "-log-level", "error",
         "-external-url", "https://storage.googleapis.com"],
        preexec_fn=_prctl_pdeathsig,  # this process is single-threaded here
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", EMULATOR_PORT, timeout=1)
            connection.request("GET", "/storage/v1/b")
            if connection.getresponse().status == 200:
                return emulator
        except OSError:
            if emulator.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {emulator.returncode}") from None
            time.sleep(0.02)
    raise RuntimeError("fake-gcs-server did not answer within 20 s")


def main(directory: str, binary: str) -> None:
    _loopback_up()
    _bind_mount(os.path.join(directory, "hosts"), "/etc/hosts")
    emulator = _start_emulator(binary, os.path.join(directory, "storage"))
    front = Front(directory)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the emulator follows (pdeathsig)
    print("ready", flush=True)
    try:
        front.serve_forever(poll_interval=0.5)
    finally:
        emulator.kill()


if __name__ == "__main__":
    main(*sys.argv[1:3])
