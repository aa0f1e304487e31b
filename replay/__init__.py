"""torbed.replay: trace capture, conversion and replay (HTTP/SSH timing traces, cell logs).

Modules: ``trace`` (the trace format), ``convert`` (pcap and relay cell logs -> traces, with
``pcap``), ``synth`` (synthetic traces), ``wire`` (the replay protocol), ``engine`` (both ends
of a replayed flow), ``client`` (the driver's ``replay`` workload, in ``WORKLOADS``),
``server`` (the far end, beside the exit), ``clock`` (client-server clock offset), ``cli``
(``torbed capture`` and ``torbed trace``); ``capture/`` holds the scripts that captured the
project's traces (replay/traces/README.md).
"""
