"""fp32 GEMM rates on BERT's shapes: XLA's dot vs bertjax's MKL kernel (cpu_gemm.py), with numpy
(OpenBLAS) and PyTorch (MKL) beside them when installed. One process, medians.

Each engine is timed in blocks of consecutive calls after a pause, alternating engines block by
block: numpy's and PyTorch's thread pools spin for a while after a call, which would steal the
cores from whichever engine ran next if single calls were interleaved.

    python bench/gemm_bench.py                 # the shapes of the benchmark workloads
    python bench/gemm_bench.py --rounds=15

Shapes are (M, K, N) of ``[M, K] x [K, N]``: the encoder's projections and FFN for W1
(BERT-base, 8x128 tokens) and W2 (hidden 256, 32x128 tokens), and the tied MLM decoder
(W2: 640 gathered positions x 30522 vocab). Results go to docs/benchmarks.md by hand.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import cpu_gemm

SHAPES = {
    "W1 qkv/out  [1024,768]x[768,768]": (1024, 768, 768),
    "W1 ffn in   [1024,768]x[768,3072]": (1024, 768, 3072),
    "W1 ffn out  [1024,3072]x[3072,768]": (1024, 3072, 768),
    "W2 ffn in   [4096,256]x[256,1024]": (4096, 256, 1024),
    "W2 ffn out  [4096,1024]x[1024,256]": (4096, 1024, 256),
    "W2 dW ffn   [256,4096]x[4096,1024]": (256, 4096, 1024),
    "W2 decoder  [640,256]x[256,30522]": (640, 256, 30522),
}


def _engines(a: np.ndarray, b: np.ndarray) -> dict:
    engines = {}
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    xla = jax.jit(lambda x, y: x @ y)
    engines["xla dot"] = lambda: xla(ja, jb).block_until_ready()
    if cpu_gemm.available():
        blas = jax.jit(cpu_gemm.dot)
        engines["bertjax blas"] = lambda: blas(ja, jb).block_until_ready()
    engines["numpy"] = lambda: a @ b
    try:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        engines["torch"] = lambda: ta @ tb
    except ImportError:
        pass
    return engines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="calls per block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per engine")
    args = parser.parse_args()
    if not cpu_gemm.available():
        print(f"bertjax blas kernel unavailable: {cpu_gemm.unavailable_reason()}")
    rng = np.random.default_rng(0)
    calls = args.rounds * args.blocks
    print(f"GFLOP/s, median of {calls} calls in {args.blocks} blocks (jax {jax.__version__})")
    header = None
    for name, (m, k, n) in SHAPES.items():
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        engines = _engines(a, b)
        if header is None:
            header = list(engines)
            print(f"| shape | {' | '.join(header)} | blas / xla |\n|---|{'---|' * len(header)}---|")
        for run in engines.values():
            run()  # compile / warm up
        times = {e: [] for e in engines}
        for _ in range(args.blocks):
            for e, run in engines.items():
                time.sleep(0.5)  # let the previous engine's threads go idle
                run()
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    run()
                    times[e].append(time.perf_counter() - start)
        rate = {e: 2 * m * k * n / statistics.median(t) / 1e9 for e, t in times.items()}
        ratio = rate["bertjax blas"] / rate["xla dot"] if "bertjax blas" in rate else float("nan")
        cells = " | ".join(f"{rate[e]:.0f}" if e in rate else "-" for e in header)
        print(f"| {name} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
