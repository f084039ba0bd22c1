"""tidegate's Airflow face: operators, the connection lookup and the DAG factory.

This folder is an Airflow plugins folder package (``plugins/`` is on ``sys.path`` in Airflow).
Use the operators in your own DAGs::

    from tidegate_airflow.operators import TidegateGuardOperator, TidegateBoundsOperator, ...

The engine (``tidegate``) never imports Airflow; this package calls it.
"""

from __future__ import annotations

__all__ = ["airflow_connection"]


def airflow_connection(conn_id: str):
    """See :func:`tidegate_airflow.connections.airflow_connection`."""
    from .connections import airflow_connection as resolve

    return resolve(conn_id)
