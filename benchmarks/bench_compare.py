"""Time of choosing k by PSIS-LOO: compare_n_components against naive NumPyro models.

Run: PYTHONPATH=. python benchmarks/bench_compare.py [--quick] [--naive-k 1,3,6] [--naive-draws 100]
     PYTHONPATH=. python benchmarks/bench_compare.py --psis-only
     PYTHONPATH=. python benchmarks/bench_compare.py --refits

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

``--refits``: the exact LOO refits of the rows PSIS flags (k-hat above the threshold, at
most 5 a fit), on real data at default settings: the fit's chains moved to the other rows
(``fit_warm``, what :func:`bayespca.loo` runs) against a new fit of the same estimator
(``clone(model).fit``, what it ran before), each refit timed, medians and their ratio, and
the largest gap between the two ``log p(x_i | x_{-i})`` beside the largest between two new
fits of other seeds: for rows of k-hat above 1 the estimate rests on a few draws, and its
delta-method standard error understates its spread, so the seeds' own gap is the yardstick.

Last, the PSIS-LOO step alone on pointwise log-likelihoods of n rows x 2000 draws (4
chains; rows of unit-scale Gaussian log-likelihoods with a quarter heavy-tailed):
:func:`bayespca.psis.psis_loo` against ``arviz_stats.loo`` with the same ``reff``, medians
of 5 calls after one untimed call each, and the largest difference of their ``elpd_i``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
import warnings

import arviz_stats
import jax
import numpy as np
from arviz_base import from_dict
from numpyro.infer import MCMC, NUTS
from scipy.special import logsumexp
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

import bayespca
from bayespca.comparison import compare, loo
from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.models import ppca
from bayespca.posterior import pointwise_log_likelihood
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


def _row_score(model, row):
    """``log mean_s p(x_i | theta_s)`` over the model's draws."""
    ll = pointwise_log_likelihood(model.nuts_, row)[..., 0]  # (chain, draw)
    return float(logsumexp(ll) - np.log(ll.size))


def _refits(model, rest, row):
    """``{kind: (seconds, score of row)}``: a warm refit to ``rest`` and new fits of two seeds."""
    out = {}
    for kind in ("warm", "new", "new, seed 1"):
        start = time.perf_counter()
        if kind == "warm":
            fitted = copy.copy(model).fit_warm(rest)
        else:
            fitted = clone(model).set_params(random_state=int(kind != "new")).fit(rest)
        out[kind] = (time.perf_counter() - start, _row_score(fitted, row))
    return out


def _refit_table(most=5):
    print("Exact LOO refits of the rows PSIS flags: fit_warm (the fit's chains moved) vs a new fit")
    wine, diabetes, cancer = load_wine().data, load_diabetes().data, load_breast_cancer().data
    cases = [("wine std, pPCA k=4", bayespca.PPCA(4), StandardScaler().fit_transform(wine)),
             ("wine raw, pPCA k=5", bayespca.PPCA(5), wine),
             ("diabetes std, FA k=5", bayespca.FactorAnalysis(5), StandardScaler().fit_transform(diabetes)),
             ("breast cancer std, pPCA k=3", bayespca.PPCA(3), StandardScaler().fit_transform(cancer))]
    for name, estimator, X in cases:
        model = estimator.set_params(method="nuts", random_state=0, progress_bar=False).fit(X)
        khat = np.asarray(loo(model, max_refits=0).pareto_k)
        rows = np.argsort(khat)[::-1][: min(most, int(np.sum(khat > 0.7)))]
        if not len(rows):
            print(f"  {name}: no row above k-hat 0.7")
            continue
        runs = [_refits(model, np.delete(X, i, axis=0), X[i : i + 1]) for i in rows]
        warm, new = (float(np.median([r[kind][0] for r in runs])) for kind in ("warm", "new"))
        gap = max(abs(r["warm"][1] - r["new"][1]) for r in runs)
        seeds = max(abs(r["new, seed 1"][1] - r["new"][1]) for r in runs)
        print(f"  {name}: {len(rows)} rows (k-hat {khat[rows].min():.2f}-{khat[rows].max():.2f}); a refit "
              f"{warm:.2f} s warm, {new:.2f} s new, ratio new / warm {new / warm:.1f}; largest |elpd_i| gap "
              f"warm - new {gap:.2f}, new - new of another seed {seeds:.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="200+200 draws, naive k=1,3 with 50 draws")
    parser.add_argument("--naive-k", default="1,3,6")
    parser.add_argument("--naive-draws", type=int, default=100)
    parser.add_argument("--psis-only", action="store_true", help="only the PSIS-LOO table")
    parser.add_argument("--refits", action="store_true", help="only the exact LOO refits' table")
    args = parser.parse_args()
    if args.refits:
        with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _refit_table()
        return
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
