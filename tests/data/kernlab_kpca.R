# Reference values for tests/test_kernel_pca.py from R kernlab::kpca on iris.
#
# Run from the repository root:  Rscript tests/data/kernlab_kpca.R
# Writes tests/data/kernlab_kpca_iris.json. Produced with R 4.2.2 and
# kernlab 0.9.32 (versions are recorded in the file).
#
# kernlab conventions (see kernlab:::kpca, signature "matrix"):
#   eig      = eigenvalues of K_c / m            (m = number of training points)
#   rotated  = K_c %*% pcv, pcv = vectors / sqrt(eig)   => sqrt(m) * a_j * sqrt(lambda_j)
#   predict  = K_c(new) %*% pcv                  => sqrt(m) * K_c(new) a_j / sqrt(lambda_j)
#   rbfdot(sigma):     exp(-sigma * ||x - y||^2)  (sigma is sklearn's gamma)
#   laplacedot(sigma): exp(-sigma * ||x - y||_2)  (Euclidean norm, not L1)
#   polydot(degree, scale, offset): (scale * <x, y> + offset)^degree
suppressPackageStartupMessages({
  library(kernlab)
  library(jsonlite)
})

x <- as.matrix(iris[, 1:4])
dimnames(x) <- NULL
# New points for predict(): every 10th flower, shifted by 0.05 in every feature.
new <- x[seq(1, 150, by = 10), ] + 0.05

kernels <- list(
  rbf = list(kernel = "rbfdot", kpar = list(sigma = 0.2)),
  laplace_l2 = list(kernel = "laplacedot", kpar = list(sigma = 0.5)),
  poly = list(kernel = "polydot", kpar = list(degree = 2, scale = 0.5, offset = 1)),
  linear = list(kernel = "vanilladot", kpar = list())
)

results <- lapply(kernels, function(spec) {
  fit <- kpca(x, kernel = spec$kernel, kpar = spec$kpar, features = 4)
  list(
    kernel = spec$kernel,
    kpar = spec$kpar,
    eig = unname(eig(fit)),
    rotated = unname(rotated(fit)),
    predict = unname(predict(fit, new))
  )
})

out <- list(
  r_version = R.version.string,
  kernlab_version = as.character(packageVersion("kernlab")),
  data = x,
  new = new,
  results = results
)
writeLines(toJSON(out, digits = I(17), auto_unbox = TRUE, pretty = FALSE),
           "tests/data/kernlab_kpca_iris.json")
