"""settled.runtime: what agent authors use — the app object and, later, RunContext effects, tools and flows."""

from settled.runtime._app import App, AppLoadError, load_app

__all__ = ["App", "AppLoadError", "load_app"]
