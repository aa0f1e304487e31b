"""Benchmarks (``make bench``): each part measures one thing and writes its JSON results
under the output directory (runs/bench/). ``python -m torbed.bench [PART ...]`` runs them
(torbed/bench/__main__.py holds the part table); each part is also a module of its own
(``python -m torbed.bench.linkemu --help``).

Not part of the library: nothing in torbed imports these (they import the local backend).
"""
