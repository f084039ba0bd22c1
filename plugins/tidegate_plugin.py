"""Registers tidegate's page with Airflow: the FastAPI app of ``tidegate_airflow.ui`` mounted at
``/tidegate`` on the api-server, and a "tidegate" entry in the UI's navigation that shows it.

This file is the only top-level module of the plugins folder that Airflow's plugin manager
loads (``.airflowignore`` keeps it out of ``tidegate_airflow/``, which is imported as a package).
Every Airflow process loads plugins, each task's process too, but only the api-server serves
the page: the app (FastAPI and the engine's status code) is built on its first request, so
loading the plugin costs a task nothing.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/tidegate"


class LazyApp:
    """An ASGI app that builds :func:`tidegate_airflow.ui.create_app` when it is first called."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from tidegate_airflow.ui import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class TidegatePlugin(AirflowPlugin):
    name = "tidegate"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "tidegate status page"}]
    external_views = [{
        "name": "tidegate",
        # Relative to the UI's base URL: it works behind a proxy path too.
        "href": URL_PREFIX.lstrip("/") + "/",
        "destination": "nav",
        "url_route": "tidegate",
        "category": "browse",
    }]
