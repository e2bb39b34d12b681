"""Plots of fitted models: scree, biplot, loadings, latent space, noise, model comparison, kernel PCA.

Every function draws with matplotlib on the Axes it is given (``ax=None``:
a new figure) and returns that Axes, so plots compose with subplots and
save with any backend, Agg included. Features are labelled with
``feature_names_in_`` when the model was fitted on a DataFrame (else
``x0, x1, ...``); ``labels=`` colours the points by a user-given label
(categories get a legend, a numeric label with more than 10 values a
colour bar).

MCMC diagnostics (trace, rank, ESS, R-hat) are ArviZ's: :func:`plot_trace`
hands the rotation-invariant posterior variables to
``arviz_plots.plot_trace_dist``; any other ArviZ plot takes the model's
``posterior_`` DataTree directly.

Credible intervals are equal-tailed: the ``(1 - ci_prob) / 2`` and
``(1 + ci_prob) / 2`` quantiles of the posterior draws.
"""

from __future__ import annotations

import numbers
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import EllipseCollection, LineCollection
from matplotlib.path import Path
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from bayespca.data import check_is_fitted

__all__ = [
    "plot_biplot",
    "plot_comparison",
    "plot_kernel_pca",
    "plot_latent",
    "plot_loadings",
    "plot_noise",
    "plot_parallel_analysis",
    "plot_scree",
    "plot_trace",
]

_MAX_CATEGORIES = 10
# Where a legend may go inside the axes, in the order tried (matplotlib's names).
_LEGEND_PLACES = ("upper right", "upper left", "lower right", "lower left", "center right", "center left",
                  "upper center", "lower center")
_NO_STYLE = ("None", "none", "", " ", None)


# ----------------------------------------------------------------- helpers
def _new_axes(ax):
    if ax is None:
        _, ax = plt.subplots()
    return ax


def _check_prob(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be a float in (0, 1); got {value!r}.")
    return float(value)


def _feature_names(model, feature_names, d):
    if feature_names is None:
        names = getattr(model, "feature_names_in_", None)
        return [str(n) for n in names] if names is not None else [f"x{j}" for j in range(d)]
    names = [str(n) for n in feature_names]
    if len(names) != d:
        raise ValueError(f"feature_names must hold {d} names (n_features); got {len(names)}.")
    return names


def _check_components(components, k):
    comps = tuple(components)
    if (
        len(comps) != 2
        or any(isinstance(c, bool) or not isinstance(c, numbers.Integral) for c in comps)
        or not all(0 <= c < k for c in comps)
        or comps[0] == comps[1]
    ):
        raise ValueError(
            f"components must be two different ints in [0, {k}) (the model has {k} components); "
            f"got {components!r}."
        )
    return [int(c) for c in comps]


def _drawn_shapes(ax):
    """What the axes show, in display pixels: (polylines, (points, radius) pairs, boxes).

    Lines (reference lines included) and line collections (error bars) as
    polylines, markers and scatter points as points with their radius,
    patches (bars, spans), texts and images as boxes.
    """
    pixels = ax.figure.dpi / 72.0
    paths, points, boxes = [], [], []
    for line in ax.get_lines():
        xy = line.get_transform().transform(line.get_xydata())
        xy = xy[np.isfinite(xy).all(axis=1)]
        if line.get_linestyle() not in _NO_STYLE and len(xy) > 1:
            paths.append(Path(xy))
        if line.get_marker() not in _NO_STYLE:
            points.append((xy, line.get_markersize() * pixels / 2))
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            transform = collection.get_transform()
            paths.extend(Path(transform.transform(seg)) for seg in collection.get_segments() if len(seg) > 1)
        elif isinstance(collection, EllipseCollection):
            # Each ellipse as its centre with the radius of its major half-axis.
            centres = collection.get_offset_transform().transform(collection.get_offsets())
            scale = np.abs(ax.transData.transform([(1.0, 1.0)]) - ax.transData.transform([(0.0, 0.0)])).max()
            points.extend((centre[None], width * scale / 2)
                          for centre, width in zip(centres, collection.get_widths(), strict=True))
        elif len(collection.get_offsets()):
            xy = collection.get_offset_transform().transform(collection.get_offsets())
            sizes = collection.get_sizes() if hasattr(collection, "get_sizes") else []
            radius = np.sqrt(np.max(sizes)) * pixels / 2 if len(sizes) else 3.0
            points.append((xy, radius))
    for text in ax.texts:
        if isinstance(text, Annotation) and text.arrow_patch is not None and text.xycoords == "data":
            # An arrow is its shaft, not the box around it (which covers a quarter of a biplot).
            paths.append(Path(ax.transData.transform([text.xyann, text.xy])))
        if text.get_text():
            boxes.append(text.get_window_extent() if not isinstance(text, Annotation) else
                         super(Annotation, text).get_window_extent())
    boxes.extend(artist.get_window_extent() for artist in [*ax.patches, *ax.images])
    return paths, points, boxes


def _hides(box, shapes) -> bool:
    """Whether the display box ``box`` covers any of ``shapes`` (see :func:`_drawn_shapes`)."""
    paths, points, boxes = shapes
    box = box.padded(2.0)
    if any(path.intersects_bbox(box, filled=False) for path in paths):
        return True
    for xy, radius in points:
        grown = box.padded(radius)
        within_x = (xy[:, 0] >= grown.x0) & (xy[:, 0] <= grown.x1)
        if np.any(within_x & (xy[:, 1] >= grown.y0) & (xy[:, 1] <= grown.y1)):
            return True
    return any(box.overlaps(other) for other in boxes)


def _legend_clear_of_data(ax, **kwargs):
    """A legend where it hides nothing drawn: a free place inside the axes, else outside on the right."""
    ax.autoscale_view()
    shapes = _drawn_shapes(ax)
    for place in _LEGEND_PLACES:
        legend = ax.legend(loc=place, **kwargs)
        if not _hides(legend.get_window_extent(), shapes):
            return legend
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def _label_candidates(tip, outward, width, height):
    """(cost, centre) of places for a ``width`` x ``height`` label at ``tip``, pointing ``outward`` (pixels).

    First beyond the tip, at growing gaps and sideways shifts; then drawn
    back alongside the arrow's last stretch (shifted sideways so as to clear
    it), for long labels near the frame.
    """
    across = np.array([-outward[1], outward[0]])
    reach = abs(outward[0]) * width / 2 + abs(outward[1]) * height / 2
    for gap in (3.0, 9.0, 18.0, 30.0, 45.0, 65.0, 90.0):
        for shift in (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5):
            yield gap + 4 * abs(shift), tip + outward * (reach + gap) + across * shift * 0.9 * height
    for back in (0.25, 0.5, 0.75, 1.0):
        for shift in (1, -1, 2, -2, 3, -3):
            centre = tip + outward * (reach + 3.0 - back * width) + across * shift * 0.9 * height
            yield 20 + back * width / 4 + 4 * abs(shift), centre


def _place_labels(ax, texts, tips) -> list:
    """Move each text next to its arrow tip (data coordinates), outward from the origin.

    Greedy, longest arrow first: of the candidate places beyond the tip, the
    nearest that lies inside the frame (3 px clear of it) and overlaps no
    label placed before; each arrow the label would cross counts as 25 px
    further out (the names have a light background). Returns each label's
    box (display pixels), None for a label that found no such place inside
    the frame (the caller widens the axes and tries again).
    """
    to_display = ax.transData
    origin = to_display.transform((0.0, 0.0))
    ends = to_display.transform(tips)
    arrows = [Path([origin, end]) for end in ends]
    frame = ax.get_window_extent().padded(-3.0)
    placed, boxes = [], [None] * len(texts)
    for i in np.argsort(-np.linalg.norm(ends - origin, axis=1), kind="stable"):
        extent = texts[i].get_window_extent()
        direction = ends[i] - origin
        length = np.linalg.norm(direction)
        outward = direction / length if length > 0 else np.array([0.0, 1.0])
        best = None
        for distance, centre in _label_candidates(ends[i], outward, extent.width, extent.height):
            box = Bbox.from_bounds(centre[0] - extent.width / 2, centre[1] - extent.height / 2,
                                   extent.width, extent.height)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if not inside or any(box.overlaps(other) for other in placed):
                continue
            crossed = sum(arrow.intersects_bbox(box, filled=False) for arrow in arrows)
            cost = 25.0 * crossed + distance  # a crossed arrow weighs as 25 px further out
            if best is None or cost < best[0]:
                best = (cost, centre, box)
        if best is not None:
            texts[i].set_position(to_display.inverted().transform(best[1]))
            placed.append(best[2])
            boxes[i] = best[2]
    return boxes


def _scatter_labelled(ax, x, y, labels, **kwargs):
    """Scatter the points, coloured by ``labels``; return one RGBA colour per point.

    Categories are drawn one collection each with their label; the caller
    adds the legend (:func:`_legend_clear_of_data`) once everything is drawn.
    """
    n = x.shape[0]
    if labels is None:
        ax.scatter(x, y, color="C0", **kwargs)
        return np.tile(plt.matplotlib.colors.to_rgba("C0"), (n, 1))
    lab = np.asarray(labels)
    if lab.shape != (n,):
        raise ValueError(f"labels must have one entry per point, shape ({n},); got shape {lab.shape}.")
    values = pd.unique(lab)
    if lab.dtype.kind in "fiu" and values.size > _MAX_CATEGORIES:
        points = ax.scatter(x, y, c=lab, cmap="viridis", **kwargs)
        ax.figure.colorbar(points, ax=ax)
        return points.to_rgba(lab)
    colours = np.empty((n, 4))
    for i, value in enumerate(values):
        rgba = plt.matplotlib.colors.to_rgba(f"C{i % 10}")
        mask = lab == value
        colours[mask] = rgba
        ax.scatter(x[mask], y[mask], color=rgba, label=str(value), **kwargs)
    return colours


def _category_legend(ax, labels) -> None:
    """The legend of :func:`_scatter_labelled`'s categories, if any, clear of the data."""
    if ax.get_legend_handles_labels()[0]:
        _legend_clear_of_data(ax, title=getattr(labels, "name", None), fontsize="small")


def _loadings(model):
    """``W``-scaled loadings (n_features, k): PCA's axes times the root of their variances."""
    if hasattr(model, "loadings_"):
        return np.asarray(model.loadings_)
    if hasattr(model, "explained_variance_") and hasattr(model, "components_"):
        return np.asarray(model.components_).T * np.sqrt(model.explained_variance_)
    raise TypeError(
        "model must be a fitted PCA, PPCA or FactorAnalysis (with components_ or loadings_); "
        f"got {type(model).__name__}."
    )


def _axis_names(model, comps):
    ratio = getattr(model, "explained_variance_ratio_", None)
    if ratio is not None:
        return [f"PC{c + 1} ({100 * ratio[c]:.1f}%)" for c in comps]
    prefix = "factor " if hasattr(model, "rotation_matrix_") else "z"
    return [f"{prefix}{c + 1}" for c in comps]


_MODEL_NAMES = {"PCA": "PCA", "PPCA": "pPCA", "FactorAnalysis": "Factor analysis"}


def _model_name(model) -> str:
    return _MODEL_NAMES.get(type(model).__name__, type(model).__name__)


def _estimate_name(model, rotation: bool = True) -> str:
    """How the shown parameters were estimated, e.g. ``"posterior mean, varimax rotation"``.

    ``rotation``: name the rotation (not for the noise, which no rotation changes).
    """
    method = getattr(model, "method_", None)
    parts = [{"nuts": "posterior mean", "svi": "SVI estimate"}.get(method, "maximum likelihood")]
    if method is None:
        parts = []  # PCA: no model to estimate
    rotation = getattr(model, "rotation", None) if rotation else None
    if isinstance(rotation, str):
        parts.append(f"{rotation} rotation")
    return ", ".join(parts)


def _structural_zeros(model, draws, shape) -> np.ndarray:
    """Zeros of the identification (the horseshoe's triangle), not estimates: labelled, not plotted.

    Entries 0 in every draw; without draws (SVI), those the anchors ``anchors_`` fix,
    ``W[p_i, l] = 0`` for ``l > i``.
    """
    if draws is not None:
        return np.all(draws == 0.0, axis=0)
    fixed = np.zeros(shape, bool)
    for i, p in enumerate(getattr(model, "anchors_", None) or ()):
        fixed[p, i + 1:] = True
    return fixed


def _loadings_draws(model):
    """Posterior draws of the (rotated) loadings, shape (draws, n_features, k), or None for ML fits."""
    if getattr(model, "nuts_", None) is None:
        return None
    w = np.asarray(model.loadings_samples_)
    w = w.reshape(-1, *w.shape[-2:])
    r = getattr(model, "rotation_matrix_", None)
    # loadings_ = W_mean R, so rotating each draw by the same R keeps the mean consistent.
    return w if r is None else w @ r


def _interval(draws, ci_prob):
    tail = (1 - ci_prob) / 2
    return np.quantile(draws, [tail, 1 - tail], axis=0)


# ------------------------------------------------------------------- scree
def plot_scree(source, *, criteria=None, ax=None):
    """Scree plot: one bar per eigenvalue, a dashed line at each selection rule's k.

    The bars are the sample-covariance eigenvalues ``lambda_j = s_j^2 / (n - 1)``;
    a rule that keeps ``k`` components is drawn at ``x = k + 0.5``, between the
    last kept and the first dropped bar, labelled ``"rule: k = ..."`` (rules
    that agree share a line; the legend lists them by ``k``). The rules are
    those of :mod:`bayespca.selection`, applied to the same singular values.

    Parameters
    ----------
    source : PCA or Selection
        A fitted :class:`bayespca.PCA` (its kept eigenvalues; all of them when
        fitted with ``n_components=None`` or a selection rule, whose
        ``selection_`` is marked too) or a :class:`bayespca.Selection`
        (its rule is always marked).
    criteria : sequence of str, optional
        Further rules to mark, from :data:`bayespca.selection.METHODS`
        (default: all of them); rules that cannot apply (e.g. ``"mle"`` with
        ``n < d``) are skipped. Needs the whole spectrum.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from bayespca import PCA
    >>> ax = plot_scree(PCA().fit(load_iris().data))
    >>> [line.get_label() for line in ax.lines]  # doctest: +NORMALIZE_WHITESPACE
    ['variance, elbow, gaic, gavish-donoho, profile-likelihood, parallel: k = 1', 'rank: k = 2',
     'aic, bic, mle: k = 3']
    """
    from bayespca.selection import METHODS, Selection, select_from_singular_values

    marked = {}
    if isinstance(source, Selection):
        s, n, d = source.singular_values, source.n_samples, source.n_features
        marked[source.method] = source.n_components
        complete = True
    elif hasattr(source, "singular_values_") and hasattr(source, "n_samples_"):
        check_is_fitted(source, "singular_values_")
        sel = source.selection_
        n, d = source.n_samples_, source.n_features_in_
        s = sel.singular_values if sel is not None else np.asarray(source.singular_values_)
        complete = s.size == min(n, d)
        if sel is not None:
            marked[sel.method] = sel.n_components
    else:
        raise TypeError(f"source must be a fitted bayespca.PCA or a Selection; got {type(source).__name__}.")
    for rule in METHODS if criteria is None else criteria:
        if rule not in METHODS:
            raise ValueError(f"criteria must hold rules from {list(METHODS)}; got {rule!r}.")
        if complete and rule not in marked:
            try:
                marked[rule] = select_from_singular_values(s, n, d, rule).n_components
            except ValueError:
                continue  # the rule does not apply to this shape of data
    ax = _new_axes(ax)
    eigenvalues = np.asarray(s) ** 2 / (n - 1)
    ks = np.arange(1, eigenvalues.size + 1)
    ax.bar(ks, eigenvalues, color="0.7", edgecolor="0.3")
    by_k = {}
    for rule, k in marked.items():
        by_k.setdefault(k, []).append(rule)
    for i, k in enumerate(sorted(by_k)):
        ax.axvline(k + 0.5, color=f"C{i}", linestyle="--", label=f"{', '.join(by_k[k])}: k = {k}")
    ax.set_xticks(ks)
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue (variance)")
    ax.set_title("Scree plot: eigenvalues and the k each rule keeps")
    if by_k:
        _legend_clear_of_data(ax, fontsize="small", title="rule: components kept", title_fontsize="small")
    return ax


# ------------------------------------------------------------------ biplot
def plot_biplot(model, X, *, components=(0, 1), labels=None, feature_names=None, arrow_scale=None, ax=None):
    """Biplot: the scores of ``X`` and one labelled loading arrow per feature.

    Scores are ``model.transform(X)``; the arrow of feature ``j`` ends at
    ``arrow_scale * L[j, components]`` with ``L`` the loadings in the units of
    ``W``: ``loadings_`` for PPCA and FactorAnalysis (posterior mean for NUTS
    fits, rotated when the model rotates), ``components_.T * sqrt(explained_variance_)``
    for PCA.

    Each feature's name sits beyond its arrow tip, moved sideways or further
    out where it would overlap another name or leave the frame (the axes
    grow until every name fits).

    Parameters
    ----------
    model : fitted PCA, PPCA or FactorAnalysis
    X : array-like of shape (n_samples, n_features)
    components : pair of int, default=(0, 1)
        Zero-based components on the x and y axes.
    labels : array-like of shape (n_samples,), optional
        Colours the points.
    feature_names : sequence of str, optional
        Default ``feature_names_in_`` or ``x0, x1, ...``.
    arrow_scale : float, optional
        Default: the longest arrow reaches 90% of the largest absolute score.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes
        Arrows are ``Annotation`` objects in ``ax.texts`` (``xy`` is the tip).

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from bayespca import PCA
    >>> data = load_iris(as_frame=True)
    >>> ax = plot_biplot(PCA(2).fit(data.data), data.data, labels=data.target)
    >>> sum(getattr(t, "arrow_patch", None) is not None for t in ax.texts)
    4
    """
    loadings = _loadings(model)
    d, k = loadings.shape
    comps = _check_components(components, k)
    scores = np.asarray(model.transform(X))[:, comps]
    arrows = loadings[:, comps]
    if arrow_scale is None:
        longest = np.max(np.linalg.norm(arrows, axis=1))
        arrow_scale = 0.9 * np.max(np.abs(scores)) / longest if longest > 0 else 1.0
    elif not (isinstance(arrow_scale, numbers.Real) and np.isfinite(arrow_scale) and arrow_scale > 0):
        raise ValueError(f"arrow_scale must be None or a positive float; got {arrow_scale!r}.")
    names = _feature_names(model, feature_names, d)
    ax = _new_axes(ax)
    _scatter_labelled(ax, scores[:, 0], scores[:, 1], labels, s=12, alpha=0.7)
    tips = arrows * arrow_scale
    for u, v in tips:
        ax.annotate("", xy=(u, v), xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": "C3"})
    # A light background keeps a name legible where it crosses another arrow or points.
    background = {"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.7, "edgecolor": "none"}
    texts = [ax.text(u, v, name, color="C3", ha="center", va="center", fontsize="small", bbox=background)
             for name, (u, v) in zip(names, tips, strict=True)]
    ax.axhline(0, color="0.8", linewidth=0.8, zorder=0)
    ax.axvline(0, color="0.8", linewidth=0.8, zorder=0)
    xlabel, ylabel = _axis_names(model, comps)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"Biplot: {_model_name(model)} scores and loadings")
    ax.update_datalim(np.vstack([tips, np.zeros((1, 2))]))
    ax.autoscale_view()
    for _ in range(12):
        boxes = _place_labels(ax, texts, tips)
        if all(box is not None for box in boxes):
            break
        # Some name found no place inside the frame: give the axes 5% more room on every side.
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        ax.set_xlim(x0 - 0.05 * (x1 - x0), x1 + 0.05 * (x1 - x0))
        ax.set_ylim(y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0))
    ax.set_xlim(ax.get_xlim())  # the names were placed for these limits: keep them
    ax.set_ylim(ax.get_ylim())
    _leaders(ax, tips, boxes)
    _category_legend(ax, labels)
    return ax


def _leaders(ax, tips, boxes, min_gap=12.0):
    """A thin line from each arrow tip to its name where the name had to move away (> ``min_gap`` px)."""
    to_display = ax.transData
    for tip, box in zip(to_display.transform(tips), boxes, strict=True):
        if box is None:
            continue
        nearest = np.clip(tip, [box.x0, box.y0], [box.x1, box.y1])
        if np.linalg.norm(nearest - tip) > min_gap:
            (x0, y0), (x1, y1) = to_display.inverted().transform([tip, nearest])
            ax.plot([x0, x1], [y0, y1], color="C3", linewidth=0.6, alpha=0.6, label="_leader")


# ---------------------------------------------------------------- loadings
def plot_loadings(model, *, kind="heatmap", ci_prob=0.9, feature_names=None, ax=None):
    """Loadings as a heatmap, or (NUTS fits) as posterior credible intervals.

    ``kind="heatmap"``: the loadings matrix (features x components; for NUTS
    fits the posterior mean) with its value in each cell; for NUTS fits a
    ``*`` marks the loadings whose ``ci_prob`` credible interval excludes 0.
    ``kind="interval"`` (NUTS fits): per feature and component, the posterior
    mean and credible interval, one colour per component. The title names the
    model, how the loadings were estimated and the rotation. Loadings that
    are 0 in every draw (the zeros of the horseshoe's triangle, ``anchors_``)
    read "fixed" in the heatmap and have no interval.

    The draws are those of the identified ``W`` (see ``identification_``),
    multiplied by ``rotation_matrix_`` for a rotated FactorAnalysis. Signs and
    order of the columns are only meaningful when ``W`` is identified.

    Parameters
    ----------
    model : fitted PCA, PPCA or FactorAnalysis
    kind : {"heatmap", "interval"}, default="heatmap"
    ci_prob : float in (0, 1), default=0.9
        The equal-tailed interval's probability; 0.9 is that of the
        horseshoe's ``loadings_interval_`` and ``support_``, so the heatmap
        marks the loadings in ``support_``.
    feature_names : sequence of str, optional
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> from sklearn.datasets import load_wine
    >>> from bayespca import FactorAnalysis
    >>> data = load_wine(as_frame=True)
    >>> ax = plot_loadings(FactorAnalysis(2).fit(data.data))
    >>> ax.get_yticklabels()[0].get_text()
    'alcohol'
    """
    if kind not in ("heatmap", "interval"):
        raise ValueError(f"kind must be 'heatmap' or 'interval'; got {kind!r}.")
    ci_prob = _check_prob(ci_prob, "ci_prob")
    draws = _loadings_draws(model)
    mean = _loadings(model) if draws is None else draws.mean(axis=0)
    d, k = mean.shape
    fixed = _structural_zeros(model, draws, (d, k))
    names = _feature_names(model, feature_names, d)
    ax = _new_axes(ax)
    if kind == "interval":
        if draws is None:
            raise ValueError("kind='interval' needs posterior draws: fit the model with method='nuts'.")
        lo, hi = _interval(draws, ci_prob)
        rows = np.arange(d)
        for j in range(k):
            y = rows + (j - (k - 1) / 2) * 0.8 / max(k, 1) * (k > 1)
            err = np.stack([mean[:, j] - lo[:, j], hi[:, j] - mean[:, j]])
            free = ~fixed[:, j]
            ax.errorbar(mean[free, j], y[free], xerr=err[:, free], fmt="o", color=f"C{j}",
                        label=f"component {j + 1}")
        ax.axvline(0, color="0.5", linewidth=0.8)
        ax.set_yticks(rows, names)
        ax.invert_yaxis()
        ax.set_xlabel(f"loading (posterior mean, {ci_prob:.0%} interval)")
        ax.set_title(f"{_model_name(model)} loadings\n({_estimate_name(model)} and {ci_prob:.0%} interval)",
                     fontsize="medium")
        _legend_clear_of_data(ax, fontsize="small")
        return ax
    vmax = float(np.max(np.abs(mean))) or 1.0
    image = ax.imshow(mean, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
    ax.figure.colorbar(image, ax=ax)
    excludes_zero = np.zeros_like(mean, dtype=bool)
    if draws is not None:
        lo, hi = _interval(draws, ci_prob)
        excludes_zero = (lo > 0) | (hi < 0)
    for (i, j), value in np.ndenumerate(mean):
        star = "*" if excludes_zero[i, j] else ""
        colour = "white" if abs(value) > 0.6 * vmax else "black"
        text = "fixed" if fixed[i, j] else f"{value:.2f}{star}"
        colour = "0.45" if fixed[i, j] else colour
        ax.text(j, i, text, ha="center", va="center", color=colour, fontsize="small")
    ax.set_yticks(np.arange(d), names)
    ax.set_xticks(np.arange(k), [str(j + 1) for j in range(k)])
    ax.set_xlabel("component")
    detail = _estimate_name(model)
    if draws is not None:
        detail += f"; * : {ci_prob:.0%} interval excludes 0"
    if fixed.any():
        detail += "\nfixed: 0 by the anchors' triangle"
    ax.set_title(f"{_model_name(model)} loadings" + (f"\n({detail})" if detail else ""), fontsize="medium")
    return ax


# ------------------------------------------------------------ latent space
def _ellipse_axes(covs, radius):
    """Full axes (major, minor) and angle (degrees) of ``{z : z^T C^{-1} z = radius^2}`` for 2 x 2 ``C``."""
    evals, evecs = np.linalg.eigh(covs)  # ascending: column 1 is the major axis
    angles = np.degrees(np.arctan2(evecs[:, 1, 1], evecs[:, 0, 1]))
    return 2 * radius * np.sqrt(np.maximum(evals[:, ::-1], 0.0)), angles


def _spread_rows(means, areas, count):
    """``count`` rows spread over the plot: the largest ellipse first, then farthest-point sampling."""
    chosen = [int(np.argmax(areas))]
    distance = np.linalg.norm(means - means[chosen[0]], axis=1)
    for _ in range(count - 1):
        chosen.append(int(np.argmax(distance)))
        distance = np.minimum(distance, np.linalg.norm(means - means[chosen[-1]], axis=1))
    return np.sort(chosen)


def _ellipses(ax, means, covs, radius, colours):
    """One collection of the ellipses ``{z : (z - m_i)^T C_i^{-1} (z - m_i) = radius^2}`` (2 x 2 ``C_i``)."""
    axes, angles = _ellipse_axes(covs, radius)
    facecolors = np.array(colours, dtype=float)
    edgecolors = facecolors.copy()
    facecolors[:, 3], edgecolors[:, 3] = 0.08, 0.8
    collection = EllipseCollection(
        axes[:, 0], axes[:, 1], angles, units="xy", offsets=means, offset_transform=ax.transData,
        facecolors=facecolors, edgecolors=edgecolors, linewidths=0.8,
    )
    ax.add_collection(collection)
    # The ellipses lie within a circle of their major semi-axis: enough for the axis limits.
    half = axes[:, :1] / 2
    ax.update_datalim(np.concatenate([means - half, means + half]))
    return collection


def plot_latent(model, X, *, components=(0, 1), prob=0.9, labels=None, max_ellipses=20, ax=None):
    """Posterior means of the latent ``z_i`` with ``prob`` credible ellipses.

    From ``model.latent_posterior(X)``: for maximum-likelihood fits
    ``z_i | x_i ~ N(M^{-1} W^T Psi^{-1} (x_i - mu), M^{-1})`` with
    ``M = I + W^T Psi^{-1} W``; for NUTS fits the mean and covariance of the
    posterior mixture over draws of ``(W, Psi, mu)`` (the ellipse then also
    carries the uncertainty of the parameters). The ellipse of point ``i`` is
    ``(z - m_i)^T C_i^{-1} (z - m_i) = chi2_2^{-1}(prob)`` with ``C_i`` the
    2 x 2 block of its covariance: it holds ``prob`` of a Gaussian's mass, and
    its axes are ``2 sqrt(chi2_2^{-1}(prob) eigenvalue)``.

    Every point is drawn; with more than ``max_ellipses`` points, ellipses
    (outlined, lightly filled) are drawn for ``max_ellipses`` of them, spread
    over the plot: the point with the largest ellipse first (e.g. the one with
    most missing entries), then each next the point farthest from those
    already chosen. Hundreds of overlapping ellipses would merge into blobs;
    without missing values they all have nearly the same size anyway.

    Parameters
    ----------
    model : fitted PPCA or FactorAnalysis
    X : array-like of shape (n_samples, n_features)
        NaN marks a missing entry (its point gets a larger ellipse).
    components : pair of int, default=(0, 1)
    prob : float in (0, 1), default=0.9
    labels : array-like of shape (n_samples,), optional
    max_ellipses : int or None, default=20
        Most ellipses drawn; None draws one per point.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes
        The ellipses are one ``EllipseCollection`` (``ax.collections[-1]``),
        in row order of the points drawn: ``get_widths()`` (major axes),
        ``get_heights()``, ``get_angles()`` (degrees), ``get_offsets()``
        (centres, equal to those points' posterior means).

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from bayespca import PPCA
    >>> X = load_iris().data
    >>> ax = plot_latent(PPCA(2).fit(X), X)
    >>> len(ax.collections[-1].get_widths()), len(plot_latent(PPCA(2).fit(X), X, max_ellipses=None)
    ...                                               .collections[-1].get_widths())
    (20, 150)
    """
    if not hasattr(model, "latent_posterior"):
        raise TypeError(f"model must be a fitted PPCA or FactorAnalysis; got {type(model).__name__}.")
    prob = _check_prob(prob, "prob")
    if max_ellipses is not None and (
        isinstance(max_ellipses, bool) or not isinstance(max_ellipses, numbers.Integral) or max_ellipses < 1
    ):
        raise ValueError(f"max_ellipses must be None or an int >= 1; got {max_ellipses!r}.")
    post = model.latent_posterior(X)
    mean, cov = np.asarray(post.mean), np.asarray(post.covariance)
    n, k = mean.shape
    comps = _check_components(components, k)
    cov = np.broadcast_to(cov, (n, k, k))[:, comps][:, :, comps]
    radius = np.sqrt(-2 * np.log1p(-prob))  # chi2 quantile with 2 degrees of freedom
    ax = _new_axes(ax)
    colours = _scatter_labelled(ax, mean[:, comps[0]], mean[:, comps[1]], labels, s=10, zorder=3)
    rows = np.arange(n)
    if max_ellipses is not None and n > max_ellipses:
        rows = _spread_rows(mean[:, comps], np.linalg.det(cov), int(max_ellipses))
    _ellipses(ax, mean[rows][:, comps], cov[rows], radius, colours[rows])
    ax.autoscale_view()
    xlabel, ylabel = _axis_names(model, comps)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    which = "" if rows.size == n else f" for {rows.size} of {n} points"
    ax.set_title(f"{_model_name(model)} latent space: posterior means of z,\n"
                 f"{prob:.0%} credible ellipses{which}", fontsize="medium")
    _category_legend(ax, labels)
    return ax


# ------------------------------------------------------------------- noise
def plot_noise(model, *, ci_prob=0.9, bins=30, feature_names=None, ax=None):
    """Posterior of the noise: ``sigma^2`` (PPCA) as a histogram, ``psi`` (FA) as intervals per feature.

    For NUTS fits: PPCA draws a histogram of the ``sigma^2`` draws with the
    posterior mean (solid line) and the ``ci_prob`` interval (shaded);
    FactorAnalysis the posterior mean and interval of each ``psi_j``. For
    maximum-likelihood fits the point estimate (``noise_variance_``) alone.

    Parameters
    ----------
    model : fitted PPCA or FactorAnalysis
    ci_prob : float in (0, 1), default=0.9
        As :func:`plot_loadings`'.
    bins : int, default=30
        Histogram bins (PPCA NUTS fits).
    feature_names : sequence of str, optional
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> from sklearn.datasets import load_wine
    >>> from bayespca import FactorAnalysis
    >>> ax = plot_noise(FactorAnalysis(2).fit(load_wine().data))
    >>> ax.get_yticklabels()[0].get_text()
    'x0'
    """
    check_is_fitted(model, "noise_variance_")
    if not hasattr(model, "latent_posterior"):
        raise TypeError(f"model must be a fitted PPCA or FactorAnalysis; got {type(model).__name__}.")
    ci_prob = _check_prob(ci_prob, "ci_prob")
    bayesian = getattr(model, "nuts_", None) is not None
    diagonal = np.ndim(model.noise_variance_) == 1
    ax = _new_axes(ax)
    if not diagonal:
        if bayesian:
            draws = np.asarray(model.noise_variance_samples_).ravel()
            lo, hi = _interval(draws, ci_prob)
            ax.hist(draws, bins=bins, color="0.7", edgecolor="0.3")
            ax.axvspan(lo, hi, color="C0", alpha=0.2, label=f"{ci_prob:.0%} interval")
            ax.axvline(draws.mean(), color="C0", label="posterior mean")
            ax.set_ylabel("draws")
        else:
            # One number: say it, and where its uncertainty would come from.
            ax.axvline(model.noise_variance_, color="C0", label=_estimate_name(model, rotation=False))
            note = f"sigma^2 = {float(model.noise_variance_):.4g}\n(method='nuts' draws its posterior)"
            ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", fontsize="medium",
                    bbox={"facecolor": "white", "edgecolor": "0.8"})
            ax.set_yticks([])
        ax.set_xlabel("sigma^2")
        _legend_clear_of_data(ax, fontsize="small")
        how = "posterior draws" if bayesian else _estimate_name(model, rotation=False)
        ax.set_title(f"{_model_name(model)} noise variance sigma^2 ({how})", fontsize="medium")
        return ax
    psi = np.asarray(model.noise_variance_)
    d = psi.size
    names = _feature_names(model, feature_names, d)
    rows = np.arange(d)
    if bayesian:
        draws = np.asarray(model.noise_variance_samples_).reshape(-1, d)
        mean = draws.mean(axis=0)
        lo, hi = _interval(draws, ci_prob)
        ax.errorbar(mean, rows, xerr=np.stack([mean - lo, hi - mean]), fmt="o", color="C0")
        ax.set_xlabel(f"psi (posterior mean, {ci_prob:.0%} interval)")
    else:
        ax.plot(psi, rows, "o", color="C0")
        ax.set_xlabel(f"psi ({_estimate_name(model, rotation=False)})")
    ax.set_yticks(rows, names)
    ax.invert_yaxis()
    ax.set_title(f"{_model_name(model)} noise variances psi (uniquenesses)", fontsize="medium")
    return ax


# -------------------------------------------------------- model comparison
_COMPARISON_COLUMNS = ("elpd", "se")


def plot_comparison(result, *, recommended=None, ax=None):
    """Expected log predictive density (elpd) against the number of components.

    Points are ``elpd`` (PSIS-LOO) with error bars of one standard error
    ``se``; a dashed line marks the recommended ``k`` and, when the table has
    the boolean column ``gavish_donoho``, a dotted one the Gavish-Donoho ``k``
    (where the two agree, the dashed line's label says so instead).
    The rule behind the recommendation (a ComparisonResult's ``rule``) is
    written under the axis label, wrapped to the width of the axes.

    Parameters
    ----------
    result : ComparisonResult or pandas.DataFrame
        What :func:`bayespca.compare_n_components` returns, or its ``.table``
        (indexed by ``n_components``, with columns ``elpd`` and ``se``).
    recommended : int, optional
        The ``k`` to mark; default ``result.n_components``, or the ``k`` of the
        largest elpd for a bare table.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"elpd": [-300.0, -250.0, -252.0], "se": [9.0, 8.0, 8.5]},
    ...                      index=pd.Index([1, 2, 3], name="n_components"))
    >>> plot_comparison(table).lines[-1].get_label()
    'recommended k = 2'
    """
    if isinstance(result, pd.DataFrame):
        table, rule = result, None
    elif hasattr(result, "table"):
        table, rule = result.table, getattr(result, "rule", None)
        if recommended is None:
            recommended = getattr(result, "n_components", None)
    else:
        raise TypeError(
            f"result must be a ComparisonResult or a pandas DataFrame; got {type(result).__name__}."
        )
    missing = [c for c in _COMPARISON_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(
            f"result's table must have columns {list(_COMPARISON_COLUMNS)}; missing {missing} "
            f"(columns: {list(table.columns)})."
        )
    table = table.sort_index()
    ks = np.asarray(table.index, dtype=float)
    elpd = table["elpd"].to_numpy(dtype=float)
    if recommended is None:
        recommended = table.index[int(np.nanargmax(elpd))]
    ax = _new_axes(ax)
    ax.errorbar(ks, elpd, yerr=table["se"].to_numpy(dtype=float), fmt="o-", color="C0", capsize=3,
                label="elpd (PSIS-LOO) ± 1 se")
    k_gd = None
    if "gavish_donoho" in table.columns and table["gavish_donoho"].astype(bool).any():
        k_gd = table.index[table["gavish_donoho"].astype(bool).to_numpy()][0]
    if k_gd is not None and k_gd != recommended:
        ax.axvline(k_gd, color="0.5", linestyle=":", label=f"Gavish-Donoho k = {k_gd}")
    # Where both rules agree one line says so: a dotted line under the dashed one could not be seen.
    also = " (also Gavish-Donoho)" if k_gd == recommended else ""
    ax.axvline(recommended, color="C3", linestyle="--", label=f"recommended k = {recommended}{also}")
    ax.set_xticks(ks)
    ax.set_xlabel("number of components k")
    ax.set_ylabel("expected log predictive density (elpd)")
    ax.set_title("Model comparison by PSIS-LOO", fontsize="medium")
    if rule is not None:
        # The rule is a sentence: wrapped to the axes' width, in small type under the axis label.
        width = ax.get_window_extent().width * 72 / ax.figure.dpi
        chars = max(30, int(width / (0.5 * 0.833 * plt.rcParams["font.size"])))
        ax.annotate("\n".join(textwrap.wrap(f"Recommended k = {recommended}: {rule}.", chars)),
                    xy=(0.5, 0.0), xycoords=ax.xaxis.label, xytext=(0, -6), textcoords="offset points",
                    ha="center", va="top", fontsize="small", color="0.25")
    _legend_clear_of_data(ax, fontsize="small")
    return ax


# --------------------------------------------------------------- kernel PCA
def plot_kernel_pca(model, X=None, *, components=(0, 1), labels=None, ax=None):
    """Kernel PCA embedding: the projections on two kernel principal components.

    With ``X=None`` the training points, ``a_j sqrt(lambda_j)`` (eigenvector
    times root eigenvalue of the centred Gram matrix); else ``model.transform(X)``.
    Axis labels give each component's eigenvalue of the centred Gram matrix.

    Parameters
    ----------
    model : fitted bayespca.KernelPCA
    X : array-like, optional
    components : pair of int, default=(0, 1)
    labels : array-like, optional
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from bayespca import KernelPCA
    >>> data = load_iris()
    >>> ax = plot_kernel_pca(KernelPCA(2, kernel="rbf", gamma=0.5).fit(data.data), labels=data.target)
    >>> len(ax.collections)
    3
    """
    if not hasattr(model, "eigenvectors_") and not hasattr(model, "eigenvalues_"):
        raise TypeError(f"model must be a fitted bayespca.KernelPCA; got {type(model).__name__}.")
    check_is_fitted(model, "eigenvalues_")
    evals = np.asarray(model.eigenvalues_)
    comps = _check_components(components, evals.size)
    Z = model.eigenvectors_ * np.sqrt(evals) if X is None else np.asarray(model.transform(X))
    ax = _new_axes(ax)
    _scatter_labelled(ax, Z[:, comps[0]], Z[:, comps[1]], labels, s=12)
    ax.set_xlabel(f"kPC{comps[0] + 1} (eigenvalue {evals[comps[0]]:.4g})")
    ax.set_ylabel(f"kPC{comps[1] + 1} (eigenvalue {evals[comps[1]]:.4g})")
    kernel = model.kernel if isinstance(model.kernel, str) else getattr(model.kernel, "__name__", "callable")
    ax.set_title(f"Kernel PCA embedding ({kernel} kernel)")
    return ax


# ----------------------------------------------------------- diagnostics
_VARIABLE_NAMES = {
    "sigma2": "noise variance sigma^2",
    "psi": "noise variances psi",
    "eigenvalues": "eigenvalues of W W^T",
    "log_lik": "log-likelihood",
}
_MAX_KEYED = 20  # a variable with more coordinates than this gets no colour key (W, for one)
_ARVIZ_COLOURS = 10  # arviz_plots' colour cycle: a key of more coordinates would show a colour twice


def plot_trace(model, var_names=None, **kwargs):
    """ArviZ trace and marginal posterior plots of a NUTS fit.

    By default the variables that mean the same under any identification of
    ``W``: the noise (``sigma2`` or ``psi``), the ``eigenvalues`` of ``W W^T``
    and ``log_lik``. This is ``arviz_plots.plot_trace_dist`` on
    ``model.posterior_`` with the matplotlib backend; ``kwargs`` go to it.
    With matplotlib, each density panel is labelled with its variable, a key
    above the panels gives the line style of each chain, and one right of the
    trace of each variable with 2 to 20 coordinates (e.g. ``eigenvalues``, or
    ``W`` of 4 features and 2 components) the colour of each; the figure is
    widened to hold them. Where such a variable has more than 10 coordinates
    (``psi`` of 13 features), matplotlib's 20 ``tab20`` colours replace
    ArviZ's cycle of 10, so no two coordinates share a colour. Coordinates
    0 in every draw (the zeros that fix ``W``'s triangle) are left out: ``W``
    of a lower-triangular fit is keyed ``W[feature, component]`` by its free
    entries only.

    Returns
    -------
    arviz_plots.PlotCollection
        ``.viz`` holds the figure; ``.savefig(path)`` saves it.
    """
    if getattr(model, "nuts_", None) is None:
        raise ValueError("plot_trace needs posterior draws: fit the model with method='nuts'.")
    from arviz_plots import plot_trace_dist

    if var_names is None:
        noise = "psi" if np.ndim(model.noise_variance_) == 1 else "sigma2"
        var_names = [noise, "eigenvalues", "log_lik"]
    var_names = [var_names] if isinstance(var_names, str) else list(var_names)
    posterior = _without_fixed_zeros(_selected(model.posterior_, kwargs.pop("coords", None)), var_names)
    kwargs.setdefault("backend", "matplotlib")
    if kwargs["backend"] == "matplotlib":
        kwargs.setdefault("figure_kwargs", {"figsize": (9.0, 1.2 + 2.0 * len(var_names))})
        if "color" not in kwargs and _widest_key(posterior, var_names) > _ARVIZ_COLOURS:
            tab20 = plt.get_cmap("tab20").colors  # dark and light of each hue in turn: the darks first
            kwargs["color"] = list(tab20[0::2] + tab20[1::2])
    collection = plot_trace_dist(posterior, var_names=var_names, **kwargs)
    if kwargs["backend"] == "matplotlib":
        _label_trace(collection, var_names)
    return collection


def _selected(tree, coords):
    """ArviZ's selection ``coords`` applied to each group of ``tree`` on the dimensions it has: here,
    before :func:`_without_fixed_zeros` merges dimensions that ArviZ could then not select on."""
    import xarray as xr

    if not coords:
        return tree
    tree = tree.copy()
    for group, node in tree.children.items():
        data = node.to_dataset()
        tree[group] = xr.DataTree(data.sel({k: v for k, v in coords.items() if k in data.dims}))
    return tree


def _without_fixed_zeros(tree, var_names):
    """``tree`` with each of ``var_names`` of two dimensions or more beyond (chain, draw) that is 0 in
    every draw at some coordinates (the zeros that fix ``W``'s triangle: ``W[i, j]``, ``j > i``) kept
    at its other coordinates only.

    Those coordinates go along one dimension named after the variable's own (``"feature, component"``,
    labels ``"4, 1"``), so that the colour key lists no constant and the density panel has no spike
    at 0 (whose density ArviZ warns it cannot estimate).
    """
    import xarray as xr

    posterior = tree["posterior"].to_dataset()
    kept = {}
    for name in var_names:
        if name not in posterior:
            continue  # ArviZ names what is missing
        values = posterior[name].transpose("chain", "draw", ...)
        dims = values.dims[2:]
        free = np.asarray((values != 0).any(("chain", "draw")))
        if len(dims) < 2 or free.all():
            continue
        index = np.argwhere(free)
        key = ", ".join(map(str, dims))
        labels = [", ".join(str(values[dim].values[i]) for dim, i in zip(dims, entry, strict=True))
                  for entry in index]
        kept[name] = xr.DataArray(
            values.values[(slice(None), slice(None), *index.T)], dims=("chain", "draw", key),
            coords={"chain": values["chain"], "draw": values["draw"], key: labels}, attrs=values.attrs,
        )
    if not kept:
        return tree
    tree = tree.copy()
    tree["posterior"] = xr.DataTree(posterior.drop_vars(list(kept)).assign(kept))
    return tree


def _widest_key(posterior, var_names) -> int:
    """Coordinates of the variable with the most of them among those that get a colour key."""
    draws = posterior["posterior"]
    per_draw = draws.sizes["chain"] * draws.sizes["draw"]
    counts = [draws[name].size // per_draw for name in var_names if name in draws]
    return max((c for c in counts if c <= _MAX_KEYED), default=0)


def _label_trace(collection, var_names) -> None:
    """Name each density panel; a key of the chains' line styles above the panels, and right of each
    variable's trace the colours of its coordinates (e.g. ``eigenvalues[0]``), the figure widened for it."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plots, aes = collection.viz["plot"], collection.aes
    figure = collection.viz["figure"].item()
    keys = []
    for name in var_names:
        dist = plots[name].sel(column="dist").item()
        dist.set_xlabel(_VARIABLE_NAMES.get(name, name))
        dist.xaxis.set_major_locator(MaxNLocator(6))  # log-likelihood ticks ran into each other
        colours = aes["color"][name] if "color" in aes.children and name in aes["color"] else None
        if colours is not None and colours.ndim >= 1 and 1 < colours.size <= _MAX_KEYED:
            # One key per variable: the colours repeat from one variable to the next.
            flat = colours.stack(entry=colours.dims)
            handles = [Line2D([], [], color=colour, label=", ".join(map(str, np.atleast_1d(entry))))
                       for entry, colour in zip(flat["entry"].values, flat.values, strict=True)]
            trace = plots[name].sel(column="trace").item()
            title = f"{name}[{', '.join(colours.dims)}]"
            keys.append(trace.legend(handles=handles, title=title, loc="center left",
                                     bbox_to_anchor=(1.02, 0.5), ncols=-(-len(handles) // 8),
                                     fontsize="x-small", title_fontsize="small", frameon=False))
    chains = []
    if "linestyle" in aes.children:
        styles = aes["linestyle"]["mapping"]
        chains = [Line2D([], [], color="0.3", linestyle=style, label=f"chain {int(chain)}")
                  for chain, style in zip(styles["chain"].values, styles.values, strict=True)]
    height = figure.get_figheight()
    # Room above the panels for the chains' key, below them for the last axis labels (inches).
    figure.subplots_adjust(top=1.0 - (0.55 if chains else 0.25) / height, bottom=0.6 / height,
                           hspace=0.6, wspace=0.25)
    if chains:
        figure.legend(handles=chains, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncols=len(chains),
                      fontsize="small", frameon=False)
    if keys:
        _widen_for(figure, keys)


def _widen_for(figure, legends) -> None:
    """Widen ``figure`` so that ``legends``, right of its panels, fit inside it; panels keep their size."""
    renderer = figure.canvas.get_renderer()
    right = max(legend.get_window_extent(renderer).x1 for legend in legends) / figure.dpi
    width = figure.get_figwidth()
    extra = right + 0.1 - width
    if extra > 0:
        panels = figure.subplotpars.right * width
        figure.set_figwidth(width + extra)
        figure.subplots_adjust(left=figure.subplotpars.left * width / (width + extra),
                               right=panels / (width + extra))


# --------------------------------------------------------- parallel analysis
def plot_parallel_analysis(result, *, ax=None):
    """Parallel analysis: the data's eigenvalues against those of random data of the same shape.

    The data's eigenvalues (``result.criterion``: the correlation matrix's,
    or the reduced one's for ``kind="fa"``) as a line with markers; each
    random data set's eigenvalues as a thin grey line, and their reference
    (quantile, or mean) dashed; a dotted vertical line after the last kept
    component.

    Parameters
    ----------
    result : bayespca.selection.ParallelAnalysis
        From :func:`bayespca.selection.parallel_analysis` or
        ``select_n_components(X, "parallel")``.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> from sklearn.datasets import load_wine
    >>> from bayespca.selection import parallel_analysis
    >>> ax = plot_parallel_analysis(parallel_analysis(load_wine().data, random_state=0))
    >>> [line.get_label() for line in ax.lines][-3:]
    ['data', 'random: 0.95 quantile', 'parallel analysis: k = 3']
    """
    from bayespca.selection import ParallelAnalysis

    if not isinstance(result, ParallelAnalysis):
        raise TypeError(f"result must be a bayespca.selection.ParallelAnalysis; got {type(result).__name__}.")
    ax = _new_axes(ax)
    ks = np.asarray(result.candidates)
    random = np.asarray(result.random_eigenvalues)
    for i, values in enumerate(random):
        ax.plot(ks, values, color="0.6", linewidth=0.5, alpha=0.6,
                label=f"{random.shape[0]} random data sets" if i == 0 else "_nolegend_")
    ax.plot(ks, result.criterion, "o-", color="C0", label="data")
    what = "mean" if result.quantile is None else f"{result.quantile:g} quantile"
    ax.plot(ks, result.reference, "--", color="0.2", label=f"random: {what}")
    ax.axvline(result.n_components + 0.5, color="C3", linestyle=":",
               label=f"parallel analysis: k = {result.n_components}")
    ax.set_xticks(ks)
    ax.set_xlabel("component" if result.kind == "pca" else "factor")
    ax.set_ylabel("eigenvalue")
    matrix = "reduced (SMC) correlation" if result.kind == "fa" else "correlation"
    ax.set_title(f"Parallel analysis ({result.kind.upper()}): {matrix} eigenvalues", fontsize="medium")
    _legend_clear_of_data(ax, fontsize="small")
    return ax
