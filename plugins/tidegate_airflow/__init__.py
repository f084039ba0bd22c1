"""tidegate's Airflow face: operators, the connection resolver and the DAG factory.

This folder is an Airflow plugins folder package (``plugins/`` is on ``sys.path`` in Airflow).
Use the operators in your own DAGs::

    from tidegate_airflow.operators import TidegateGuardOperator, TidegateBoundsOperator, ...

The engine (``tidegate``) never imports Airflow; this package calls it.
"""

from __future__ import annotations

__all__ = ["airflow_resolver"]


def airflow_resolver(conn_id: str):
    """See :func:`tidegate_airflow.connections.airflow_resolver`."""
    from .connections import airflow_resolver as resolve

    return resolve(conn_id)
