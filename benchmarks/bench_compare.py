"""Time of choosing k by PSIS-LOO: compare_n_components against naive NumPyro models.

Run: PYTHONPATH=. python benchmarks/bench_compare.py [--quick] [--naive-k 1,3,6] [--naive-draws 100]
     PYTHONPATH=. python benchmarks/bench_compare.py --psis-only

Data: n=1000, d=20, three true components. Both sides run in this process, one BLAS thread.

* ``bayespca``: :func:`bayespca.compare_n_components` for k = 1..6, 4 chains of 500 + 500
  draws, everything included (NUTS on sufficient statistics, marginal pointwise
  log-likelihood, PSIS-LOO, comparison, ML criteria, 5-fold CV of the ML fit).
* ``naive``: NumPyro NUTS on :func:`bayespca.models.ppca` with ``latent="explicit"`` (one
  ``z_i`` per row), then the marginal pointwise log-likelihood of each draw, PSIS-LOO with
  the same ``reff``, and :func:`bayespca.compare`. Too slow to run in full, it is timed on
  the k in ``--naive-k`` with one chain of ``--naive-draws`` warm-up + kept draws, and
  extrapolated: ``compile + per_iteration * 4 chains * 1000 iterations`` per k, with the
  compile time measured by a 1 + 1 draw run and the per-iteration cost from the longer
  run minus it; k not timed are interpolated linearly in k. Short warm-up leaves NUTS's
  step size less adapted than in a full run, so the per-iteration cost is approximate
  (printed, with the leapfrog steps per iteration).

Last, the PSIS-LOO step alone on pointwise log-likelihoods of n rows x 2000 draws (4
chains; rows of unit-scale Gaussian log-likelihoods with a quarter heavy-tailed):
:func:`bayespca.psis.psis_loo` against ``arviz_stats.loo`` with the same ``reff``, medians
of 5 calls after one untimed call each, and the largest difference of their ``elpd_i``.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

import arviz_stats
import jax
import numpy as np
from arviz_base import from_dict
from numpyro.infer import MCMC, NUTS
from threadpoolctl import threadpool_limits

import bayespca
from bayespca.comparison import compare, loo
from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.models import ppca
from bayespca.psis import psis_loo

CHAINS, WARMUP, SAMPLES = 4, 500, 500


def _data(n=1000, d=20, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, 3)) * np.array([3.0, 2.0, 1.5])
    return rng.normal(size=(n, 3)) @ w.T + 0.7 * rng.normal(size=(n, d)) + 5.0


def _naive_run(X, k, draws, seed):
    """Wall time, leapfrog steps per iteration and ELPDData of one explicit-z run."""
    model = functools.partial(ppca, n_components=k, latent="explicit", identification="none")
    mcmc = MCMC(NUTS(model), num_warmup=draws, num_samples=draws, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), X, extra_fields=("num_steps",))
    s = mcmc.get_samples()
    g = LowRankGaussian(s["W"], jax.numpy.repeat(s["sigma"][:, None] ** 2, X.shape[1], 1), s["mu"])
    ll = np.asarray(jax.lax.map(lambda p: log_prob(LowRankGaussian(*p), X), tuple(g)))
    sigma = np.asarray(s["sigma"])[None]
    tree = from_dict({"log_likelihood": {"X": ll[None]}, "posterior": {"sigma": sigma}})
    result = loo(tree) if draws >= 4 else None  # PSIS needs more than the compile run's draw
    wall = time.perf_counter() - start
    steps = float(np.mean(mcmc.get_extra_fields()["num_steps"]))
    return wall, steps, result


def _median_time(call, repeats=5):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _psis_table(rows=(1000, 10000)):
    print("PSIS-LOO of n rows x 2000 draws: bayespca.psis.psis_loo vs arviz_stats.loo (median of 5)")
    rng = np.random.default_rng(0)
    for n in rows:
        ll = -2.0 + rng.normal(size=(CHAINS, 500, n)) * rng.uniform(0.1, 2.0, n)
        ll[..., : n // 4] += np.clip(0.3 * rng.standard_t(2.0, size=(CHAINS, 500, n // 4)), -30, 30)
        tree = from_dict({"posterior": {"mu": np.zeros((CHAINS, 500))}, "log_likelihood": {"X": ll}},
                         dims={"X": ["obs"]})
        ours = functools.partial(psis_loo, tree["log_likelihood"]["X"], 1.0)
        theirs = functools.partial(arviz_stats.loo, tree, pointwise=True, var_name="X", reff=1.0)
        gap = float(np.max(np.abs(ours().elpd_i.values - theirs().elpd_i.values)))
        t_ours, t_theirs = _median_time(ours), _median_time(theirs)
        print(f"  n={n:6d}: ours {t_ours:.3f} s, ArviZ {t_theirs:.3f} s, ratio {t_ours / t_theirs:.2f}; "
              f"max |elpd_i difference| {gap:.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="200+200 draws, naive k=1,3 with 50 draws")
    parser.add_argument("--naive-k", default="1,3,6")
    parser.add_argument("--naive-draws", type=int, default=100)
    parser.add_argument("--psis-only", action="store_true", help="only the PSIS-LOO table")
    args = parser.parse_args()
    if args.psis_only:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _psis_table()
        return
    warmup, samples = (200, 200) if args.quick else (WARMUP, SAMPLES)
    naive_ks = [1, 3] if args.quick else [int(k) for k in args.naive_k.split(",")]
    naive_draws = 50 if args.quick else args.naive_draws
    X = _data()
    ks = list(range(1, 7))
    print(f"bayespca {bayespca.__version__}, jax {jax.__version__}, backend {jax.default_backend()}")
    print(f"n={X.shape[0]} d={X.shape[1]}, k=1..6, {CHAINS} chains x ({warmup}+{samples})")

    with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        res = bayespca.comparison.compare_n_components(
            X, ks, num_chains=CHAINS, num_warmup=warmup, num_samples=samples, random_state=0
        )
        ours = time.perf_counter() - start
        print(f"bayespca compare_n_components: {ours:.1f} s, recommended k = {res.n_components}")
        print(res.table[["elpd", "se", "elpd_diff", "dse", "pareto_k_max", "cv_log_likelihood"]].round(2))

        full_iters = CHAINS * (warmup + samples)
        timed, elpds = {}, {}
        for k in naive_ks:
            compile_wall = _naive_run(X, k, 1, 0)[0]
            wall, steps, elpds[k] = _naive_run(X, k, naive_draws, 0)
            per_iter = max(wall - compile_wall, 0.0) / (2 * naive_draws)
            timed[k] = compile_wall + per_iter * full_iters
            print(
                f"naive k={k}: compile+1 draw {compile_wall:.1f} s, {2 * naive_draws} iterations "
                f"{wall:.1f} s ({steps:.0f} leapfrog steps/iteration), extrapolated to "
                f"{CHAINS} x {warmup + samples}: {timed[k]:.0f} s; elpd {elpds[k].elpd:.1f}, "
                f"max k-hat {float(np.max(elpds[k].pareto_k)):.2f}"
            )
        if len(elpds) >= 2:
            print(compare(elpds)[["elpd", "elpd_diff", "dse", "pareto_k_max"]].round(2))
    known = sorted(timed)
    naive_total = float(np.sum(np.interp(ks, known, [timed[k] for k in known])))
    print(f"naive total (k=1..6, extrapolated): {naive_total:.0f} s")
    print(f"ratio naive / bayespca: {naive_total / ours:.0f}x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _psis_table()


if __name__ == "__main__":
    main()
