"""Generate questionnaire.csv: 25 Likert items (1-6) answered by 1000 simulated people.

A five-factor structure in the spirit of personality inventories: factors
A, C, E, N, O, five items each (``A1``..``O5``), main loadings 0.45-0.75,
some items reverse-keyed (negative loading), small cross-loadings, and
correlated factors (so oblique rotations have something to find). Each item is
a continuous response ``x = L f + e`` (unit variance) cut into six ordered
categories at fixed thresholds, as respondents do.

The true loadings and factor correlations are written next to the data
(questionnaire_truth.csv, questionnaire_phi.csv) so the notebook can compare
what factor analysis recovers with what generated the data.

Run: python notebooks/data/make_questionnaire.py   (deterministic, seed 2026)
"""

from pathlib import Path

import numpy as np
import pandas as pd

FACTORS = ["A", "C", "E", "N", "O"]
SEED = 2026
N_PEOPLE = 1000
THRESHOLDS = np.array([-1.6, -0.8, -0.1, 0.6, 1.3])  # six categories, a little skewed


def truth(rng):
    k = len(FACTORS)
    items = [f"{f}{j}" for f in FACTORS for j in range(1, 6)]
    loadings = np.zeros((len(items), k))
    for a in range(k):
        main = rng.uniform(0.45, 0.75, size=5)
        sign = np.where(rng.random(5) < 0.3, -1.0, 1.0)
        sign[0] = 1.0  # the first item of each scale is keyed positively
        loadings[5 * a : 5 * a + 5, a] = main * sign
    cross = rng.normal(0.0, 0.08, size=loadings.shape) * (loadings == 0)
    loadings += cross
    phi = np.eye(k)
    for a, b, r in [(0, 2, 0.30), (1, 3, -0.25), (2, 4, 0.20), (0, 1, 0.15), (2, 3, -0.20)]:
        phi[a, b] = phi[b, a] = r
    return items, loadings, phi


def main():
    rng = np.random.default_rng(SEED)
    items, loadings, phi = truth(rng)
    factors = rng.multivariate_normal(np.zeros(len(FACTORS)), phi, size=N_PEOPLE)
    common = factors @ loadings.T
    unique_sd = np.sqrt(1.0 - np.einsum("ia,ab,ib->i", loadings, phi, loadings))
    latent = common + rng.standard_normal(common.shape) * unique_sd
    answers = 1 + np.searchsorted(THRESHOLDS, latent)
    here = Path(__file__).parent
    pd.DataFrame(answers, columns=items).to_csv(here / "questionnaire.csv", index=False)
    pd.DataFrame(loadings.round(4), index=items, columns=FACTORS).to_csv(here / "questionnaire_truth.csv")
    pd.DataFrame(phi, index=FACTORS, columns=FACTORS).to_csv(here / "questionnaire_phi.csv")


if __name__ == "__main__":
    main()
