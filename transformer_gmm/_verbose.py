"""The ``verbose`` reports of TransformerGMM and TransformerClusterer fits, in
scikit-learn's words.

scikit-learn's ``BaseMixture`` prints as each initialisation runs; here every
initialisation runs in one batched EM loop, so the same lines are printed when the loop
has ended, from each run's lower bound at each iteration, with the batch's clock for the
time lapses.
"""

from __future__ import annotations

import numpy as np


def _changes(bounds: np.ndarray, initial: float) -> np.ndarray:
    """The change of the lower bound at each iteration of one run, as its loop saw it."""
    with np.errstate(invalid="ignore"):  # -inf - -inf is never reached: initial < bounds
        return np.diff(np.concatenate([[initial], bounds]))


def report(
    lower_bounds: np.ndarray,
    iteration_times: np.ndarray,
    *,
    best_run: int,
    best_converged: bool,
    tol: float,
    initial_lower_bound: float,
    max_iter: int,
    verbose: int,
    verbose_interval: int,
) -> None:
    """Print scikit-learn's EM report for each run (row of ``lower_bounds`` (R, T), NaN after
    it stopped): initialization, iterations every ``verbose_interval``, convergence, and with
    ``verbose >= 2`` times and lower-bound changes.
    """
    if len(lower_bounds) > 1:
        print(f"{len(lower_bounds)} initializations run as one batch; time lapses are the batch's.")
    for run, bounds in enumerate(lower_bounds):
        print(f"Initialization {run}")
        if max_iter == 0:
            continue
        bounds = bounds[~np.isnan(bounds)]
        if not len(bounds) and run != best_run:
            print('  Not run: n_init="auto" leaves out k-means++ starts the transformer\'s '
                  "make needless (see n_init).")
            continue
        changes = _changes(bounds, initial_lower_bound)
        previous_time = 0.0
        for n_iter, change in enumerate(changes, start=1):
            if n_iter % verbose_interval:
                continue
            if verbose == 1:
                print(f"  Iteration {n_iter}")
            else:
                lapse = iteration_times[n_iter - 1] - previous_time
                print(f"  Iteration {n_iter}\t time lapse {lapse:.5f}s\t ll change {change:.5f}")
                previous_time = iteration_times[n_iter - 1]
        converged = best_converged if run == best_run else bool(np.abs(changes[-1:]) < tol)
        message = "converged" if converged else "did not converge"
        if verbose == 1:
            print(f"Initialization {message}.")
        else:
            lapse = iteration_times[len(bounds) - 1] if len(bounds) else 0.0
            lower_bound = bounds[-1] if len(bounds) else initial_lower_bound
            print(
                f"Initialization {message}. time lapse {lapse:.5f}s\t lower bound "
                f"{lower_bound:.5f}."
            )


def _lloyd_lines(steps: list, threshold: float) -> list[list[str]]:
    """scikit-learn's lines for each run of one batched Lloyd loop (``steps``, its
    :class:`~transformer_gmm.engine.kmeans.LloydStep` per iteration)."""
    if not steps:
        return []
    lines = [[] for _ in range(int(steps[0].rows.max()) + 1)]
    for iteration, step in enumerate(steps):
        columns = (step.rows, step.active, step.inertia, step.shift, step.strict)
        for run, active, inertia, shift, strict in zip(*(c.tolist() for c in columns), strict=True):
            if not active:
                continue
            lines[run].append(f"Iteration {iteration}, inertia {inertia}.")
            if strict:
                lines[run].append(f"Converged at iteration {iteration}: strict convergence.")
            elif shift <= threshold:
                lines[run].append(
                    f"Converged at iteration {iteration}: center shift {shift} within "
                    f"tolerance {threshold}."
                )
    return lines


def kmeans_report(trace: list[list], *, threshold: float) -> None:
    """Print scikit-learn's ``KMeans`` report for each run of a TransformerClusterer fit from
    ``trace``: initialization, each Lloyd iteration's inertia, and how the run converged.
    """
    runs, refit = (_lloyd_lines(steps, threshold) for steps in trace)
    if len(runs) > 1:
        print(f"{len(runs)} initializations run as one batch.")
    for lines in runs:
        print("Initialization complete")
        for line in lines:
            print(line)
    if refit:
        print("The kept initialization, on every row:")
        for line in refit[0]:
            print(line)
