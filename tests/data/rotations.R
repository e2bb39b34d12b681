# Reference rotations for tests/test_rotations.py, from R's stats and GPArotation.
#
# Run from the repository root:  Rscript tests/data/rotations.R
# Writes tests/data/rotation_reference.json. The unrotated input loadings are the
# fixed 4 x 2 matrix of scikit-learn's FactorAnalysis rotation test and
# maximum-likelihood factor analyses (stats::factanal, rotation = "none") of two
# data sets shipped with R: ability.cov (6 tests, 2 factors) and Harman74.cor
# (24 psychological tests, 4 factors).
#
# Convergence is tightened below the R defaults so that the Python side can compare
# tightly. stats::varimax stops when its criterion grows by less than a factor
# 1 + eps (default 1e-5); the criterion is flat at the optimum, so that leaves an
# error of order sqrt(eps) in the loadings. It runs here with eps = 0: it stops when
# rounding makes the criterion stop growing, or after its fixed 1000 iterations.
# stats::promax calls varimax(x) with the default eps and has no argument to change
# it, so promax_tight is stats::promax with that one call replaced by
# varimax(x, eps = 0); nothing else differs. GPArotation stops when
# the Frobenius norm of the projected gradient is below eps (default 1e-5), but its
# Armijo line search stalls once the decrease it asks for falls below the rounding
# error of the criterion (around 1e-7 to 1e-9 here), so each GPArotation case uses
# the smallest eps in 1e-9, 1e-8, 1e-7, 1e-6 that it reaches; the JSON records it.
suppressPackageStartupMessages(library(GPArotation))
library(jsonlite)

promax_tight <- stats::promax
body(promax_tight) <- do.call(
  substitute,
  list(body(stats::promax), list(varimax = quote(function(x) stats::varimax(x, eps = 0))))
)

gpa_tight <- function(fun, L, ...) {
  for (eps in c(1e-9, 1e-8, 1e-7, 1e-6)) {
    r <- suppressWarnings(fun(L, ..., eps = eps, maxit = 2000L))
    if (r$convergence) {
      r$eps <- eps
      return(r)
    }
  }
  stop("GPArotation did not reach eps = 1e-6")
}

unrotated <- function(fit) {
  L <- unclass(fit$loadings)
  dimnames(L) <- NULL
  L
}

plain <- function(x) {
  x <- unclass(x)
  dimnames(x) <- NULL
  x
}

cases_for <- function(L) {
  k <- ncol(L)
  out <- list()
  for (norm in c(TRUE, FALSE)) {
    v <- stats::varimax(L, normalize = norm, eps = 0)
    out[[length(out) + 1]] <- list(
      method = "varimax", normalize = norm, options = setNames(list(), character(0)),
      loadings = plain(v$loadings), matrix = plain(v$rotmat), factor_correlation = diag(k),
      converged = TRUE, source = sprintf("stats::varimax(L, normalize = %s, eps = 0)", norm)
    )
    q <- gpa_tight(GPArotation::quartimax, L, normalize = norm)
    out[[length(out) + 1]] <- list(
      method = "quartimax", normalize = norm, options = setNames(list(), character(0)),
      loadings = plain(q$loadings), matrix = plain(q$Th), factor_correlation = diag(k),
      converged = q$convergence, eps = q$eps,
      source = sprintf("GPArotation::quartimax(L, normalize = %s, eps = %g)", norm, q$eps)
    )
    for (gam in c(0, 0.5)) {
      o <- gpa_tight(GPArotation::oblimin, L, gam = gam, normalize = norm)
      out[[length(out) + 1]] <- list(
        method = "oblimin", normalize = norm, options = list(gamma = gam),
        loadings = plain(o$loadings), matrix = t(solve(o$Th)), factor_correlation = plain(o$Phi),
        converged = o$convergence, eps = o$eps,
        source = sprintf("GPArotation::oblimin(L, gam = %s, normalize = %s, eps = %g)",
                         gam, norm, o$eps)
      )
    }
  }
  for (m in c(4, 3)) {
    p <- promax_tight(L, m = m)
    Rinv <- solve(p$rotmat)
    out[[length(out) + 1]] <- list(
      method = "promax", normalize = TRUE, options = list(power = m),
      loadings = plain(p$loadings), matrix = plain(p$rotmat),
      factor_correlation = Rinv %*% t(Rinv), converged = TRUE,
      source = sprintf("stats::promax(L, m = %s), its varimax step with eps = 0", m)
    )
  }
  out
}

# The fixed 4 x 2 loading matrix of scikit-learn's test_factor_analysis.py
# (first two columns of `factors` there).
sklearn_factors <- matrix(c(0.89421016, -0.35854928,
                            -0.45081822, -0.89132754,
                            0.99500666, -0.02031465,
                            0.96822861, -0.06299656), 4, byrow = TRUE)

datasets <- list(
  list(name = "scikit-learn test_factor_analysis.py fixed loadings (factors[:, :2])",
       loadings = sklearn_factors),
  list(name = "ability.cov, factanal(factors = 2, covmat = ability.cov, rotation = 'none')",
       loadings = unrotated(factanal(factors = 2, covmat = ability.cov, rotation = "none"))),
  list(name = "Harman74.cor, factanal(factors = 4, covmat = Harman74.cor, rotation = 'none')",
       loadings = unrotated(factanal(factors = 4, covmat = Harman74.cor, rotation = "none")))
)
for (i in seq_along(datasets)) datasets[[i]]$cases <- cases_for(datasets[[i]]$loadings)

result <- list(
  generated_by = "tests/data/rotations.R",
  r_version = R.version.string,
  gparotation_version = as.character(packageVersion("GPArotation")),
  datasets = datasets
)
writeLines(toJSON(result, digits = NA, auto_unbox = TRUE, matrix = "rowmajor", pretty = FALSE),
           "tests/data/rotation_reference.json")
