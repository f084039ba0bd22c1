"""A test deployment's auth manager with per-DAG rights: Airflow's SimpleAuthManager (its users,
roles and passwords file, its login page) whose DAG rights are narrowed, per user, to the DAG
ids listed for that user in the JSON file named by ``TIDEGATE_TEST_DAG_ACCESS``
(``{"user": ["dag_id", ...]}``). A user the file does not list (``admin``) keeps its role's
rights on every DAG; a listed user has its role's rights on its DAGs and none on the others.

SimpleAuthManager has roles only; this is the lightest honest way to give two users different
DAG rights in tests of the tidegate page. The page itself calls only the generic auth manager
API (``is_authorized_dag`` with ``DagDetails(id=...)``), so FAB or Keycloak deployments decide
with their own per-DAG permissions. Configured through scripts/services:
``TIDEGATE_AIRFLOW_AUTH_MANAGER=tests.integration.dag_allowlist_auth.DagAllowListAuthManager``
(``[core] auth_manager``), ``TIDEGATE_AIRFLOW_USERS`` and ``TIDEGATE_AIRFLOW_PASSWORDS_FILE``.
Test support only: never configure it in a real deployment.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ACCESS_ENV = "TIDEGATE_TEST_DAG_ACCESS"


def allowed_dags(user_name: str) -> set[str] | None:
    """The DAG ids ``user_name`` is limited to; None when the file does not limit the user.
    Read on every check, so a test can change rights without restarting Airflow."""
    path = os.environ.get(ACCESS_ENV)
    if not path:
        return None
    with open(path) as f:
        lists = json.load(f)
    return set(lists[user_name]) if user_name in lists else None


class DagAllowListAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None,
                          details: Any = None) -> bool:
        if not super().is_authorized_dag(method=method, user=user, access_entity=access_entity,
                                         details=details):
            return False
        dag_id = getattr(details, "id", None)
        allowed = allowed_dags(user.get_name())
        # Without a DAG id Airflow asks "may the user reach DAGs at all" (and filters the list
        # per DAG after): a limited user may, for its own DAGs.
        return allowed is None or dag_id is None or dag_id in allowed
