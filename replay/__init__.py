"""torbed.replay: trace capture, conversion and replay (HTTP/SSH timing traces, cell logs).

Not implemented yet (issue "Trace capture and replay"); the measurement driver's
``WORKLOADS`` registry is where a ``replay`` workload will plug in.
"""
