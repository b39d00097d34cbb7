"""Framework callbacks: ``babysitter.integrations.lightning`` and ``babysitter.integrations.hf``.

Import the submodule for your framework; this package imports neither framework itself.
"""

__all__: list[str] = []
