"""Backends: where a scenario's network runs, one folder each. The engine drives them.

Adding a backend NAME: a package ``torbed/backends/NAME/`` whose ``__init__`` is its face to
the core (keep it light: import the backend itself on use):

- ``HELP``: one line for ``torbed run --backend``
- ``Options``: a dataclass of its command-line options, ``Options.from_args(args)``
- ``add_arguments(parser)``: those options (``torbed run`` and ``torbed nightly`` add them)
- ``backend_class() -> type``: the class implementing ``torbed.engine.Backend``
- ``create(options, console, scenario_path) -> Backend``
- ``plan_lines(plan) -> [str]``: what ``torbed plan`` prints for it (may be empty)
- ``register_commands(sub, fmt)``: subcommands only it has (may add none)

plus its name in ``torbed.engine.BACKENDS``. Nothing outside ``torbed/backends`` imports a
backend (tests/unit/test_layout.py): the core reaches them by name through that table.
"""
