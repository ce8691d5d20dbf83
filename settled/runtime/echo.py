"""``settled worker --app settled.runtime.echo:app``: the built-in echo agent."""

from settled.runtime._echo import EchoAgent, app

__all__ = ["EchoAgent", "app"]
