"""What ``vocab --runner=<Beam>`` brings to the WordPiece learner, and the memory it takes (#36).

    python bench/vocab_beam_bench.py --corpus=/tmp/many_words.txt --distinct=6000000 \
        --frequent=500000 [--repo=.]

Makes (once, if ``--corpus`` does not exist) a corpus of ``--distinct`` distinct words: word
``r`` (0-based, 5-8 lower-case letters, all distinct) occurs ``max(1, round(frequent / (r + 1)))``
times (Zipf's law over the first ``--frequent`` words, then one occurrence each), shuffled with
a fixed seed into lines of 12 words and documents of 20 lines. Then, in a fresh process whose
peak RSS the kernel reports (``ru_maxrss``), it runs the Beam word counting of ``--repo``'s code
on DirectRunner in that process (Prism kept off): ``vocab_beam.learner_input`` where the checkout
has it, else the older ``vocab_beam.count_words`` (every distinct word). Prints the words that
reach the learner's process, the bytes of the result the workers write for it
(``<scratch>/result.json``), the wall time and the peak RSS.
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
NO_PRISM = "--prism_location=/nonexistent/prism"


def _word(r: int) -> str:
    letters, length = [], 5 + r % 4
    for _ in range(length):
        r, digit = divmod(r, 26)
        letters.append(chr(97 + digit))
    return "".join(reversed(letters))


def make_corpus(path: str, distinct: int, frequent: int) -> None:
    ranks = np.arange(distinct)
    counts = np.maximum(1, np.round(frequent / (ranks + 1))).astype(np.int64)
    tokens = np.repeat(ranks, counts)
    np.random.default_rng(0).shuffle(tokens)
    words = [_word(r) for r in range(distinct)]
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, len(tokens), 240):  # a document: 20 lines of 12 words
            document = tokens[start : start + 240]
            lines = (" ".join(words[t] for t in document[i : i + 12]) for i in range(0, 240, 12))
            f.write("\n".join(line for line in lines if line) + "\n\n")
    print(f"{path}: {len(tokens)} words, {distinct} distinct, {os.path.getsize(path)} bytes")


def measure(corpus: str) -> None:
    """In this process: the Beam reading; prints one JSON line."""
    from bertjax.data import beam_pipeline, vocab_beam

    sizes = []
    read_result = beam_pipeline.read_result

    def recording(scratch):
        sizes.append(beam_pipeline.gfile().stat(f"{scratch}/result.json").length)
        return read_result(scratch)

    beam_pipeline.read_result = recording
    output = os.path.join(tempfile.mkdtemp(), "vocab.txt")
    start = time.perf_counter()
    if hasattr(vocab_beam, "learner_input"):
        given = vocab_beam.learner_input([corpus], True, 0, output, "DirectRunner", NO_PRISM)
        words, what = len(given.words), "learner_input"
    else:
        words, what = (
            len(vocab_beam.count_words([corpus], True, output, "DirectRunner", NO_PRISM)),
            "count_words",
        )
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps(dict(what=what, words=words, result_bytes=sizes[0], wall=wall, peak_mib=peak)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--distinct", type=int, default=6_000_000)
    parser.add_argument("--frequent", type=int, default=500_000)
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose code runs")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(args.corpus)
    if not os.path.exists(args.corpus):
        make_corpus(args.corpus, args.distinct, args.frequent)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=args.repo)
    command = [sys.executable, __file__, f"--corpus={args.corpus}", "--measure"]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"code {args.repo}: {r['what']}: {r['words']} words reach the learner's process, "
          f"result {r['result_bytes'] / 1e6:.1f} MB; wall {r['wall']:.0f} s; "
          f"peak RSS {r['peak_mib']:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
