"""The suite's command processes, forked from one that has imported what they import.

A ``python -m bertjax.main`` process spends about 5 of its 10 CPU seconds importing TensorFlow,
JAX, Flax, optax and orbax, and the suite starts dozens of them (the kill, preemption and
multi-process tests). A zygote is a process that imports those once and then forks each command
process from itself: the child gets its own pid, file descriptors 0-2, working directory,
environment and ``sys.argv``, and runs the module with ``runpy`` as ``python -m`` would, then
exits as the interpreter does (non-daemon threads joined, ``atexit`` handlers run). Signals,
``kill -9``, exit statuses and pipes behave as with ``subprocess``.

What a fork cannot give a child is a fresh import, so:

- the zygote imports with no ``JAX_*`` or ``XLA_FLAGS`` in its environment and never starts a JAX
  backend (a backend's threads would not survive the fork); a child applies its own ``JAX_*``
  variables to ``jax.config`` and ``bertjax.startup``'s defaults before its module runs, and XLA
  reads its ``XLA_FLAGS`` when the child's backend starts;
- what a command prints while importing (``bertjax.startup``'s quiet start) is not the child's:
  the tests of start-up output run real processes (``tests/commands/tiny_run.py``'s reference
  run, ``tests/commands/help_test.py``, ``compile_test``'s).

:class:`Zygote` starts one (``prefix``: a command to run it under, e.g. ``nsenter`` into the
GCS emulator's namespaces) and forks children with :meth:`Zygote.popen` and :meth:`Zygote.run`,
which take ``subprocess.Popen``'s and ``subprocess.run``'s arguments for ``[python, -m, module,
args...]``. :func:`popen` and :func:`run` use this process's zygote (started on first use).
``python -m tests.zygote SOCKET`` is the zygote itself.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# What the command processes import before they compute: loaded once, in the zygote. Not the
# commands' own modules (``bertjax.main``): runpy runs those fresh, as ``python -m`` does.
PRELOAD = (
    "bertjax.cli",
    "bertjax.pretrain.loop",
    "bertjax.finetune.loop",
    "bertjax.finetune.sweep",
    "bertjax.finetune.tasks",
    "bertjax.data.pipeline",
    "tensorflow_text",
    "orbax.checkpoint",
    "clu.metric_writers",
)
OPTIONAL = ("google.cloud.storage",)  # the gcs extra's
_MAX_FDS = 3  # a child's stdin, stdout, stderr


def _send(conn: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(conn, [header + data], list(fds))
    else:
        conn.sendall(header + data)


def _receive(conn: socket.socket, with_fds: bool = False) -> tuple[dict | None, list[int]]:
    """One message (``None`` at end of stream) and the descriptors that came with it."""
    if with_fds:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, _MAX_FDS)
    else:
        data, fds = conn.recv(4), []
    if not data:
        return None, fds
    while len(data) < 4:
        data += conn.recv(4 - len(data))
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


# ---------------------------------------------------------------------------------------------
# The zygote process


def _apply_jax_environment() -> None:
    """The child's ``JAX_*`` variables as ``jax.config`` values (JAX read the zygote's, which had
    none, when it was imported)."""
    import jax  # noqa: PLC0415
    from jax._src import config as jax_config  # noqa: PLC0415

    for name, holder in jax_config.config._value_holders.items():
        raw = os.environ.get(name.upper())
        if raw is None:
            continue
        current = holder.value
        if isinstance(current, bool):
            value = raw.lower() in ("y", "yes", "t", "true", "on", "1")
        elif isinstance(current, int):
            value = int(raw)
        elif isinstance(current, float):
            value = float(raw)
        else:
            value = raw
        jax.config.update(name, value)


def _child(request: dict, fds: list[int], keep_open: list[socket.socket]) -> None:
    """In the forked child: becomes ``python -m MODULE ARGS`` and exits with its status."""
    code = 1
    try:
        for sock in keep_open:  # the zygote's sockets: not this process's to close or use
            sock.detach()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from bertjax import startup  # noqa: PLC0415

        startup.set_platform_defaults()
        _apply_jax_environment()
        import runpy  # noqa: PLC0415

        sys.path[0] = request["cwd"]
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit status 1
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        code = 1
    finally:
        try:  # what the interpreter does at exit
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str) -> None:
    """The zygote: imports :data:`PRELOAD`, then forks a child per request on ``path``."""
    import ctypes  # noqa: PLC0415
    import importlib  # noqa: PLC0415

    from bertjax import startup  # noqa: PLC0415

    # Dies with the test process that started it (PR_SET_PDEATHSIG): no zygote outlives a suite.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)

    startup.import_tensorflow()
    for module in PRELOAD:
        importlib.import_module(module)
    for module in OPTIONAL:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            while children:
                try:
                    pid, status, usage = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    try:
                        cpu = usage.ru_utime + usage.ru_stime
                        _send(conn, {"returncode": os.waitstatus_to_exitcode(status), "cpu": cpu})
                    except OSError:
                        pass  # the client is gone
                    conn.close()
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = _receive(conn, with_fds=True)
            if request is None or len(fds) != 3:
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, fds, [listener, conn, *children.values()])
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            _send(conn, {"pid": pid})


# ---------------------------------------------------------------------------------------------
# The client side: subprocess's interface


class Child:
    """A forked command process, with the part of ``subprocess.Popen``'s interface the suite
    uses: ``pid``, ``stdout``/``stderr`` (pipes when asked), ``poll``, ``wait``,
    ``communicate``, ``send_signal``, ``kill``, ``terminate``, ``returncode``."""

    def __init__(self, args, conn: socket.socket, pid: int, stdout, stderr, zygote: Zygote):
        self.args, self.pid, self.stdout, self.stderr = args, pid, stdout, stderr
        self.stdin = None
        self.returncode: int | None = None
        self._conn, self._zygote = conn, zygote
        self._readers: list[threading.Thread] | None = None
        self._output: dict[str, object] = {}

    def _read_status(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        self._conn.settimeout(timeout)
        try:
            message, _ = _receive(self._conn)
        except (TimeoutError, BlockingIOError):
            return False
        finally:
            if self.returncode is None and self._conn.fileno() >= 0:
                self._conn.settimeout(None)
        if message is None:
            raise RuntimeError(f"the zygote stopped before {self.args} ended")
        self.returncode = message["returncode"]
        self._conn.close()
        global _forked_cpu
        with _lock:
            _forked_cpu += message["cpu"]
            self._zygote.children_cpu += message["cpu"]
        return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):  # noqa: A002
        if input is not None:
            raise ValueError("a zygote child has no stdin")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._readers is None:  # started once: a call after a timeout joins the same ones

            def drain(name, stream):
                self._output[name] = stream.read()
                stream.close()

            self._readers = [
                threading.Thread(target=drain, args=(name, stream), daemon=True)
                for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
                if stream is not None
            ]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output.get("stdout"), self._output.get("stderr")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def module_of(argv) -> tuple[str, list[str]] | None:
    """(module, args) of ``[python, -m, module, args...]``, else None."""
    argv = [str(a) for a in argv]
    if (
        len(argv) >= 3
        and argv[1] == "-m"
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    ):
        return argv[2], argv[3:]
    return None


class Zygote:
    """A zygote process (``prefix`` + ``python -m tests.zygote SOCKET``) and its children."""

    def __init__(self, prefix: tuple[str, ...] = (), env: dict | None = None):
        self.children_cpu = 0.0  # of its children that ended: counted in forked_cpu() already
        self._dir = tempfile.mkdtemp(prefix="bertjax-zygote-")
        self.path = os.path.join(self._dir, "socket")
        base = dict(os.environ if env is None else env)
        for name in list(base):  # JAX reads these when imported: each child brings its own
            if name.startswith("JAX_") or name == "XLA_FLAGS":
                del base[name]
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "tests.zygote", self.path],
            cwd=REPO,
            env=base,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the zygote did not start: {line!r} (exit {self.process.wait()})")

    def popen(
        self,
        argv,
        *,
        env=None,
        cwd=None,
        stdin=None,
        stdout=None,
        stderr=None,
        text=False,
        universal_newlines=None,
        **unsupported,
    ) -> Child | subprocess.Popen:
        """``subprocess.Popen(argv, ...)``, forked from the zygote when ``argv`` runs a module."""
        text = text or bool(universal_newlines)
        target = module_of(argv)
        if target is None or unsupported or stdin not in (None, subprocess.DEVNULL):
            return subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout,
                                    stderr=stderr, text=text, **unsupported)  # fmt: skip
        mine = []  # descriptors this process opened for the child: closed here once sent

        def descriptor(spec, default_fd):
            if spec is None:
                return default_fd, None
            if spec == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                mine.append(fd)
                return fd, None
            if spec == subprocess.PIPE:
                read, write = os.pipe()
                mine.append(write)
                return write, read
            return (spec if isinstance(spec, int) else spec.fileno()), None

        stdin_fd, _ = descriptor(subprocess.DEVNULL, 0)
        stdout_fd, stdout_read = descriptor(stdout, 1)
        if stderr == subprocess.STDOUT:
            stderr_fd, stderr_read = stdout_fd, None
        else:
            stderr_fd, stderr_read = descriptor(stderr, 2)
        module, args = target
        request = {
            "module": module,
            "args": args,
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            _send(conn, request, (stdin_fd, stdout_fd, stderr_fd))
            reply, _ = _receive(conn)
        finally:
            for fd in mine:
                os.close(fd)
        if reply is None:
            raise RuntimeError(f"the zygote refused {argv}")
        wrap = lambda fd: None if fd is None else open(fd, "r" if text else "rb")  # noqa: E731
        return Child(list(argv), conn, reply["pid"], wrap(stdout_read), wrap(stderr_read), self)

    def run(self, argv, *, capture_output=False, timeout=None, check=False, **kwargs):
        """``subprocess.run(argv, ...)``, forked from the zygote when ``argv`` runs a module."""
        if capture_output:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        proc = self.popen(argv, **kwargs)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        if check:
            done.check_returncode()
        return done

    def close(self) -> None:
        """Stops the zygote. Its ``RUSAGE`` reaches this process's ``RUSAGE_CHILDREN`` now,
        its ended children's included: those leave :func:`forked_cpu`, which counted them."""
        global _forked_cpu
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with _lock:
            _forked_cpu -= self.children_cpu
            self.children_cpu = 0.0
        self.process.stdout.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
        os.rmdir(self._dir)


_zygote: Zygote | None = None
_lock = threading.Lock()
_forked_cpu = 0.0  # CPU seconds of the children this process saw end


def forked_cpu() -> float:
    """CPU seconds (user + system) of the forked children whose end this process has seen: the
    ``RUSAGE_CHILDREN`` of processes that are the zygote's children, not this one's
    (``bench/suite_cost.py`` adds it)."""
    return _forked_cpu


def shared() -> Zygote:
    """This process's zygote, started on first use and stopped at exit."""
    global _zygote
    with _lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = Zygote()
            atexit.register(_zygote.close)
        return _zygote


def popen(argv, **kwargs):
    """``subprocess.Popen``; a ``[python, -m, module, ...]`` command is forked from the zygote."""
    if module_of(argv) is None:
        return subprocess.Popen(argv, **kwargs)
    return shared().popen(argv, **kwargs)


def run(argv, **kwargs):
    """``subprocess.run``; a ``[python, -m, module, ...]`` command is forked from the zygote."""
    if module_of(argv) is None:
        return subprocess.run(argv, **kwargs)
    return shared().run(argv, **kwargs)


if __name__ == "__main__":
    serve(sys.argv[1])
