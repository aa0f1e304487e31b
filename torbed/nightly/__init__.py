"""Nightly benchmark jobs: a matrix of scenarios x variants run every night, every run's
results kept in a history store, and tonight compared with earlier nights of the same kind.

Modules:

- ``spec``     the nightly definition file (``NightlySpec``, ``load(path)``), decoded strictly
               like a scenario
- ``history``  the history store (SQLite, versioned): ``History(dir)``, ``ingest(run_dir)``,
               ``nights(key)``
- ``detect``   regression detection: lookback z-score on per-night medians plus a
               Mann-Whitney test on the raw samples (``detect(history, spec, night)``)
- ``report``   HTML, Markdown and JSON with trend plots (``write_report``)
- ``runner``   ``torbed nightly NIGHTLY.yaml --history DIR``: run the matrix, ingest, detect,
               report; exit 0 (nothing flagged), 3 (a change flagged), 1 (a run failed),
               2 (bad input)
"""
