# Fixture for tests/test_probabilistic.py: maximum-likelihood factor analysis
# of R's built-in `mtcars` data (32 cars x 11 variables; Henderson & Velleman
# 1981) by stats::factanal, which minimises the ML discrepancy over the
# uniquenesses with L-BFGS-B on the correlation matrix.
#
# Reproduce from the repository root (R >= 4.2, no extra packages):
#     Rscript tests/data/factanal_mtcars.R
# It writes tests/data/factanal_mtcars_data.csv (the data) and
# tests/data/factanal_mtcars.json (the fits).
out_dir <- "tests/data"
X <- as.matrix(mtcars)
write.csv(mtcars, file.path(out_dir, "factanal_mtcars_data.csv"), row.names = FALSE)

fmt <- function(x) formatC(x, digits = 15, format = "g")
vec <- function(x) paste0("[", paste(fmt(as.numeric(x)), collapse = ", "), "]")
mat <- function(m) paste0("[", paste(apply(m, 1, vec), collapse = ", "), "]")

entries <- c()
for (k in 2:3) {
  # Tight optimiser tolerance (factr = 1000, i.e. ~2e-13 relative; smaller values
  # make optim give up on these data) and the default
  # lower bound 0.005 on the uniquenesses, which these fits never reach.
  ctrl <- list(opt = list(factr = 1000, maxit = 10000))
  f <- factanal(X, factors = k, rotation = "none", control = ctrl)
  fv <- factanal(X, factors = k, rotation = "varimax", control = ctrl)
  fp <- factanal(X, factors = k, rotation = "promax", control = ctrl)
  entries <- c(entries, paste0(
    "\"", k, "\": {",
    "\"uniquenesses\": ", vec(f$uniquenesses), ", ",
    "\"loadings\": ", mat(unclass(f$loadings)), ", ",
    "\"varimax_loadings\": ", mat(unclass(fv$loadings)), ", ",
    "\"promax_loadings\": ", mat(unclass(fp$loadings)), ", ",
    "\"objective\": ", fmt(f$criteria[["objective"]]), ", ",
    "\"converged\": ", tolower(as.character(f$converged)), "}"
  ))
}
json <- paste0(
  "{\"n_obs\": ", nrow(X), ", ",
  "\"log_det_correlation\": ", fmt(determinant(cor(X), logarithm = TRUE)$modulus[1]), ", ",
  "\"columns\": [", paste0("\"", colnames(X), "\"", collapse = ", "), "], ",
  "\"fits\": {", paste(entries, collapse = ", "), "}, ",
  "\"R_version\": \"", R.version.string, "\"}"
)
writeLines(json, file.path(out_dir, "factanal_mtcars.json"))
