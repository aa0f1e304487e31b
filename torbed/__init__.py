"""torbed: a testbed for comparing Tor relay scheduling designs on a private Tor network.

Modules: ``scenario`` (the model), ``network`` (plan), ``keys``, ``torrc``, ``variants``,
``shaping``, ``netns``, ``supervise``, ``backends.local``, ``client.driver``, ``collectors``,
``records``, ``fileserver``, ``cli``; ``torbed.analysis`` (reports) and ``torbed.replay``.
"""

__version__ = "0.1.0"
