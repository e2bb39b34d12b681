"""A first look at bayespca on the iris data: PCA and the rules for choosing k."""

from sklearn.datasets import load_iris

from bayespca import PCA, select_n_components
from bayespca.selection import METHODS


def main():
    X = load_iris(as_frame=True).data
    pca = PCA(n_components=2, standardize=True).fit(X)
    print("PCA(2, standardize=True) on iris")
    print("  explained variance ratio:", pca.explained_variance_ratio_.round(4))
    for name, row in zip(pca.get_feature_names_out(), pca.components_, strict=True):
        loadings = ", ".join(f"{f}={v:+.3f}" for f, v in zip(X.columns, row, strict=True))
        print(f"  {name}: {loadings}")
    print(f"  pPCA log-likelihood per sample: {pca.score(X):.4f}")
    print("\nNumber of components chosen by each rule:")
    for method in METHODS:
        sel = select_n_components(X, method)
        print(f"  {method:>20}: k = {sel.n_components}   ({sel.rule})")


if __name__ == "__main__":
    main()
