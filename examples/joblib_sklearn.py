"""scikit-learn on smartexec through joblib: no change to the scikit-learn code.

scikit-learn parallelises cross-validation, grid searches and forests through
joblib. ``import smartexec.joblib`` registers a joblib backend named
``"smartexec"``; inside ``joblib.parallel_config(backend="smartexec")`` every
``n_jobs=`` of scikit-learn runs on a ``SmartExecutor``, which routes each
batch on the function inside it (here scikit-learn's ``_fit_and_score``:
pure Python and NumPy, importable, so fork workers, started in milliseconds).

This script scores a support-vector classifier on scikit-learn's bundled
digits data set (no download) with ``cross_val_score`` and a small
``GridSearchCV``: serially, on joblib's default backend (loky) and on the
smartexec backend; the scores must be identical, and it prints where
smartexec ran the work.

Run:
    python examples/joblib_sklearn.py           # 10-fold CV, 6-point grid
    python examples/joblib_sklearn.py --small   # 3-fold CV, 2-point grid

Needs joblib and scikit-learn (``pip install 'smartexec[joblib]' scikit-learn``);
without them it says so and exits 0. Set SMARTEXEC_EXAMPLES_SMALL=1 to get
--small without the flag.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:
    import joblib
    import sklearn
except ImportError as exc:
    print(
        f"joblib_sklearn.py: skipped, {exc.name} is not installed "
        f"(pip install 'smartexec[joblib]' scikit-learn)"
    )
    sys.exit(0)

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.svm import SVC

from smartexec.joblib import SmartBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="3 folds and a 2-point grid")
    args = parser.parse_args()
    small = args.small or os.environ.get("SMARTEXEC_EXAMPLES_SMALL") == "1"
    folds = 3 if small else 10
    grid = {"C": [1.0, 10.0] if small else [0.3, 1.0, 3.0, 10.0, 30.0, 100.0]}

    X, y = load_digits(return_X_y=True)
    model = SVC(gamma=0.001)
    print(
        f"digits: {X.shape[0]} images of {X.shape[1]} pixels; scikit-learn "
        f"{sklearn.__version__}, joblib {joblib.__version__}; {folds}-fold CV, "
        f"grid C={grid['C']}\n"
    )

    def both(n_jobs):
        scores = cross_val_score(model, X, y, cv=folds, n_jobs=n_jobs)
        search = GridSearchCV(model, grid, cv=folds, n_jobs=n_jobs).fit(X, y)
        return scores, search.cv_results_["mean_test_score"]

    runs = {}
    start = time.perf_counter()
    runs["serial"] = both(None)
    print(f"serial                       {time.perf_counter() - start:6.2f} s")

    start = time.perf_counter()
    runs["joblib default (loky)"] = both(-1)
    print(f"joblib default (loky)        {time.perf_counter() - start:6.2f} s")

    backend = SmartBackend()  # an instance, to read its decisions afterwards
    start = time.perf_counter()
    with joblib.parallel_config(backend=backend):
        runs["smartexec"] = both(-1)
    print(f'parallel_config("smartexec") {time.perf_counter() - start:6.2f} s\n')

    for name, (scores, grid_scores) in runs.items():
        np.testing.assert_array_equal(scores, runs["serial"][0], err_msg=name)
        np.testing.assert_array_equal(grid_scores, runs["serial"][1], err_msg=name)
    print(
        f"all three give the same scores: CV mean {runs['serial'][0].mean():.4f}, "
        f"best C={grid['C'][int(np.argmax(runs['serial'][1]))]}"
    )
    print("\nwhere smartexec ran each function (SmartBackend.decisions()):")
    for decision in dict.fromkeys(backend.decisions()):
        print(decision)


if __name__ == "__main__":
    main()
