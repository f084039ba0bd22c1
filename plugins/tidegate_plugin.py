"""Registers tidegate's page with Airflow: the FastAPI app of ``tidegate_airflow.ui`` mounted at
``/tidegate`` on the api-server, and a "tidegate" entry in the UI's navigation that shows it.

This file is the only top-level module of the plugins folder that Airflow's plugin manager
loads (``.airflowignore`` keeps it out of ``tidegate_airflow/``, which is imported as a package).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from tidegate_airflow.ui import URL_PREFIX, create_app


class TidegatePlugin(AirflowPlugin):
    name = "tidegate"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "tidegate status page"}]
    external_views = [{
        "name": "tidegate",
        # Relative to the UI's base URL: it works behind a proxy path too.
        "href": URL_PREFIX.lstrip("/") + "/",
        "destination": "nav",
        "url_route": "tidegate",
        "category": "browse",
    }]
