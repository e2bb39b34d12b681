"""How bayespca speaks to its users: warnings that point at the user's code, numbers that keep the evidence.

Every warning the package raises goes through :func:`warn`, which skips the
package's own frames (``warnings.warn(..., skip_file_prefixes=...)``,
Python >= 3.12): a user sees the line of *their* code that asked for the
work, not a line inside bayespca. Numbers compared with a threshold are
printed by :func:`shown_above` with enough digits to read on the right side
of it. Progress bars (:func:`progress`) show where a person is likely
watching (:func:`interactive`) unless the user says otherwise.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["MORE_DRAWS", "interactive", "progress", "shown_above", "warn"]

# The end of a sampler's warning about R-hat or ESS where the estimator's chains can run on (PPCA,
# FactorAnalysis: bayespca.posterior.diagnose); callers that hand the user no such estimator
# (compare_n_components, the command line) take it off.
MORE_DRAWS = " More draws without a new warm-up: sample_more()."

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Issue a warning attributed to the first caller outside bayespca.

    Examples
    --------
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn("a message")
    >>> caught[0].filename.startswith(_PACKAGE_DIR)
    False
    """
    warnings.warn(message, category, skip_file_prefixes=(_PACKAGE_DIR,))


def shown_above(value: float, threshold: float) -> str:
    """``value`` with the fewest decimals (at least 2) that still read as above ``threshold``.

    Examples
    --------
    >>> shown_above(0.7004, 0.7), shown_above(0.93, 0.7), shown_above(1.0102, 1.01)
    ('0.7004', '0.93', '1.0102')
    """
    for decimals in range(2, 16):
        text = f"{value:.{decimals}f}"
        if float(text) > threshold:
            return text
    return repr(float(value))


def interactive() -> bool:
    """Whether a person is likely watching: a terminal on stderr, or a Jupyter kernel.

    Progress bars default to on there and off elsewhere (logs, tests, CI).
    """
    import sys

    if "ipykernel" in sys.modules:
        return True
    stream = getattr(sys, "stderr", None)
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def progress(progress_bar: bool | None, **options):
    """A ``tqdm`` progress bar made with ``options``, or None where ``progress_bar`` asks for none.

    ``progress_bar`` None shows one only where a person is likely watching
    (:func:`interactive`). ``tqdm.auto`` draws a widget in a notebook and
    text in a terminal; it is imported only when a bar is shown.

    Examples
    --------
    >>> progress(False, total=10) is None
    True
    """
    if not (interactive() if progress_bar is None else progress_bar):
        return None
    from tqdm.auto import tqdm

    return tqdm(**options)
