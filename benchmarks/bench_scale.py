"""Statistics, PCA and PPCA (closed form, NUTS) on Dask data generated chunk by chunk, never materialised.

    python benchmarks/bench_scale.py --rows 100_000_000 --features 50
    python benchmarks/bench_scale.py --rows 10_000_000 --compare   # beside IncrementalPCA and dask-ml

The data are ``Z W^T + noise`` (k = 5), each chunk drawn from its own seed
on the worker that needs it, on a LocalCluster of ``--workers`` worker
processes. Reported per step: wall time, the largest memory one worker
held (``distributed``'s sampled process memory), and for the statistics the
throughput in GB/s against a single in-memory ``X.T @ X`` on one chunk in
the same run (the machine's limit for this reduction) and against the rate
at which the workers generate the chunks (the source's limit).
``--compare`` runs, on the same data, scikit-learn's ``IncrementalPCA``
(one ``partial_fit`` per chunk) and dask-ml's ``PCA`` when installed
(``pip install 'bayespca[bench]'``; where it fails, its randomized SVD by
hand).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def make_data(rows: int, d: int, chunk: int, k: int = 5):
    import dask.array as da

    loadings = np.random.default_rng(0).normal(size=(d, k))

    def block(block_info=None):
        (start, stop), _ = block_info[None]["array-location"]
        rng = np.random.default_rng([1, start])
        z = rng.normal(size=(stop - start, k))
        return z @ loadings.T + rng.normal(size=(stop - start, d))

    chunks = ((chunk,) * (rows // chunk) + ((rows % chunk,) if rows % chunk else ()), (d,))
    return da.map_blocks(block, chunks=chunks, dtype=float, meta=np.empty((0, 0)))


class PeakMemory:
    """Largest process memory of any worker while the block runs (sampled by the scheduler)."""

    def __init__(self, client):
        self.client = client

    def __enter__(self):
        self.peak = 0.0
        self.start = time.perf_counter()
        return self

    def sample(self):
        info = self.client.scheduler_info(n_workers=-1)["workers"].values()
        self.peak = max([self.peak, *(w["metrics"]["memory"] / 1e9 for w in info)])

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        self.sample()


def timed(client, label, fn, rows, d, report):
    import threading

    with PeakMemory(client) as mem:
        stop = threading.Event()

        def poll():
            while not stop.wait(0.5):
                mem.sample()

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            out = fn()
        finally:
            stop.set()
            thread.join()
    gbs = rows * d * 8 / 1e9 / mem.seconds
    report.append((label, mem.seconds, mem.peak, gbs))
    print(f"{label:<28} {mem.seconds:9.2f} s   peak/worker {mem.peak:6.2f} GB   {gbs:6.2f} GB/s", flush=True)
    return out


def dask_ml_pca(client, X, rows, d, report):
    """dask-ml's PCA; where it fails, its algorithm (Dask's randomized SVD of the centred rows) by hand.

    dask-ml 2025.1's ``PCA.fit`` passes the whole array to ``delayed`` to
    read its shape, which gathers every row onto one worker: above a
    worker's memory the workers are killed. The fallback times the same
    arithmetic without that gather (``svd_compressed``, no power iterations,
    dask-ml's default).
    """
    import dask
    import dask.array as da
    from distributed.scheduler import KilledWorker

    try:
        from dask_ml.decomposition import PCA as DaskMLPCA
    except ImportError:
        print("dask-ml is not installed (pip install 'bayespca[bench]'): its PCA is not measured")
        return
    try:
        timed(client, "dask-ml PCA(5)", lambda: DaskMLPCA(5, random_state=0).fit(X), rows, d, report)
        return
    except KilledWorker as exc:
        print(f"dask-ml PCA(5) failed: {type(exc).__name__} (the rows gathered on one worker)")
        client.restart()

    def by_hand():
        centred = X - X.mean(axis=0)
        _, s, v = da.linalg.svd_compressed(centred, 5, n_power_iter=0, seed=0)
        return dask.compute(s, v)

    timed(client, "dask svd_compressed(5)", by_hand, rows, d, report)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--chunk", type=lambda s: int(float(s)), default=500_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nuts", type=int, nargs=3, default=(500, 500, 4),
                        metavar=("WARMUP", "DRAWS", "CHAINS"))
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    from bayespca import PCA, PPCA
    from bayespca.statistics import prepare

    rows, d = args.rows, args.features
    X = make_data(rows, d, args.chunk)
    print(f"n = {rows:.3g} x d = {d} ({rows * d * 8 / 1e9:.1f} GB, chunks of {args.chunk:.3g} rows), "
          f"{args.workers} workers")
    seconds = []
    for _ in range(3):  # the best of 3: the first pays for fresh pages
        start = time.perf_counter()
        one = np.asarray(make_data(args.chunk, d, args.chunk).compute(scheduler="sync"))
        seconds.append(time.perf_counter() - start)
    source = args.workers * one.size * 8 / 1e9 / min(seconds)
    print(f"generating the chunks: {source:.2f} GB/s on {args.workers} workers (the source's limit here)")
    start = time.perf_counter()
    for _ in range(3):
        one.T @ one
    limit = 3 * one.size * 8 / 1e9 / (time.perf_counter() - start)
    print(f"one in-memory X.T @ X on a chunk: {limit:.2f} GB/s (the reduction's limit here)")
    report = []
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, memory_limit="4GB",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        prepared = timed(client, "statistics", lambda: prepare(X), rows, d, report)
        timed(client, "PCA(5), covariance", lambda: PCA(5).fit(X), rows, d, report)
        timed(client, "PPCA(5), closed form", lambda: PPCA(5).fit(X), rows, d, report)
        warmup, draws, chains = args.nuts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            timed(client, f"PPCA(5), NUTS {warmup}+{draws}x{chains}",
                  lambda: PPCA(5, method="nuts", num_warmup=warmup, num_samples=draws,
                               num_chains=chains, random_state=0).fit(X), rows, d, report)
        if args.compare:
            from sklearn.decomposition import IncrementalPCA

            def incremental():
                ipca = IncrementalPCA(5)
                for block in X.blocks:
                    ipca.partial_fit(block.compute())
                return ipca

            timed(client, "sklearn IncrementalPCA(5)", incremental, rows, d, report)
            dask_ml_pca(client, X, rows, d, report)
    ours = report[1][1]
    ours_labels = ("statistics", "PPCA", "PCA")
    others = [(label, seconds) for label, seconds, _, _ in report if not label.startswith(ours_labels)]
    for label, seconds in others:
        print(f"PCA(5) / {label:<28} {ours / seconds:6.2f}")
    if others:
        print(f"PCA(5) / the fastest alternative: {ours / min(s for _, s in others):.2f} (target <= 0.5)")
    print(f"statistics throughput: {report[0][3] / limit:.2f} of the in-memory X.T @ X, "
          f"{report[0][3] / source:.2f} of the source's rate; scale {prepared.scale}")


if __name__ == "__main__":
    main()
