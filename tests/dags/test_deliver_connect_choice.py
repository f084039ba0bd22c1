"""How the deliver operator chooses between spark-submit and Spark Connect: by the conn type of
the spec's Spark connection, as the Apache Spark provider defines them (no server needed)."""

from __future__ import annotations

import json

import pytest


def test_a_spark_connect_connection_makes_the_task_a_connect_client(monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from tidegate_airflow.operators.deliver import spark_conn_type

    monkeypatch.setenv("AIRFLOW_CONN_SC", json.dumps({"conn_type": "spark_connect", "host": "sc://127.0.0.1",
                                                      "port": 15002, "password": "t0ken"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    assert spark_conn_type("sc") == "spark_connect"
    assert spark_conn_type("spark_default") == "spark"
    # The URL the client opens (its token is why the operator never logs it).
    assert SparkConnectHook("sc").get_connection_url() == "sc://127.0.0.1:15002/;token=t0ken"


def test_a_missing_spark_connection_names_both_kinds_of_connection(monkeypatch):
    from tidegate_airflow.exceptions import UnsafeConnectionTransportError
    from tidegate_airflow.operators.deliver import spark_conn_type

    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(UnsafeConnectionTransportError) as caught:
        spark_conn_type("nowhere")
    text = str(caught.value)
    assert "'nowhere' is not defined" in text and "AIRFLOW_CONN_NOWHERE" in text
    assert '"conn_type":"spark"' in text and '"conn_type":"spark_connect"' in text


@pytest.mark.parametrize("conn", [
    {"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 15002, "password": "t0ken"},
    {"conn_type": "spark_connect", "host": "spark.example", "port": 443, "login": "etl", "password": "t/k n",
     "extra": {"use_ssl": True}},
    {"conn_type": "spark_connect", "host": "sc://127.0.0.1"},
])
def test_tidegate_run_opens_the_url_the_deliver_task_opens(monkeypatch, conn):
    """`tidegate run` builds the Connect URL without Airflow (the engine never imports it): it
    must be the URL Airflow's SparkConnectHook gives the deliver task, for the same connection."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from tidegate.connections import get_connection
    from tidegate.spark.connect import connect_url

    monkeypatch.setenv("AIRFLOW_CONN_SC", json.dumps(conn))
    assert connect_url(get_connection("sc")) == SparkConnectHook("sc").get_connection_url()
