"""The tidegate page of the Airflow UI: a FastAPI app mounted under the api-server at
``/tidegate`` (registered by ``plugins/tidegate_plugin.py``, which owns the prefix and builds this
app on the first request, with a "tidegate" nav entry).

Read-only. It uses Airflow's own auth: the session cookie the UI sets at login (or a bearer
token); without one a browser is sent to Airflow's login page and an API client gets 401; a
user who may not read DAGs gets 403. The data comes from the engine
(:func:`tidegate.status.pipelines_status`); this module only renders it.
"""

from __future__ import annotations

import html
import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response


def _connection_lookup(conn_id: str):
    """Connections as the api-server sees them (environment, secrets backends, metadata DB)."""
    from tidegate.connections import get_connection
    from tidegate.errors import ConnectionConfigError

    try:
        return get_connection(conn_id)
    except ConnectionConfigError:
        from airflow.models.connection import Connection

        from .connections import from_airflow

        return from_airflow(conn_id, Connection.get_connection_from_secrets(conn_id))


async def _reader(request: Request) -> Any:
    """The logged-in user, allowed to read DAGs (raises 401/403 otherwise)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get("_token")
    user = await resolve_user_from_token(token)
    if not get_auth_manager().is_authorized_dag(method="GET", user=user):
        raise HTTPException(status_code=403, detail="this user may not read DAGs")
    return user


def status_document() -> dict[str, Any]:
    from tidegate.parts import Parts
    from tidegate.status import pipelines_status

    return pipelines_status(parts=Parts(_connection_lookup))


Reader = Annotated[Any, Depends(_reader)]


def create_app() -> FastAPI:
    app = FastAPI(title="tidegate", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def to_login(request: Request, exc: HTTPException) -> Response:
        # A browser without a session goes to Airflow's login page and comes back here.
        if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), 303)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse)
    def page(user: Reader) -> HTMLResponse:
        return HTMLResponse(render(status_document(), getattr(user, "username", None) or "?"))

    @app.get("/api/status")
    def status(user: Reader) -> JSONResponse:
        return JSONResponse(status_document())

    return app


# --------------------------------------------------------------------------- rendering

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1d2733}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin:0} h3{font-size:.95rem;margin:.9rem 0 .3rem}
section.pipeline{border:1px solid #cfd8e3;border-radius:6px;padding:.8rem 1rem;margin:0 0 1rem}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:4px;font-size:.8rem;font-weight:600}
.ok{background:#dcf2e3;color:#155d2c} .halted{background:#fbdada;color:#8a1111}
table{border-collapse:collapse;font-size:.85rem;width:100%} th,td{border-bottom:1px solid #e4e9ef;
padding:.25rem .4rem;text-align:left;vertical-align:top} code,pre{font-size:.8rem;background:#f3f5f8}
pre{padding:.3rem .5rem;margin:.2rem 0;white-space:pre-wrap} .muted{color:#66727f;font-size:.8rem}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _pos(p: Any) -> str:
    if p is None:
        return "<span class=muted>none</span>"
    return f"<code>{_e(json.dumps(p, sort_keys=True))}</code>"


def _num(v: Any, unit: str = "") -> str:
    if v is None:
        return "<span class=muted>?</span>"
    if isinstance(v, float):
        v = f"{v:,.1f}"
    elif isinstance(v, int):
        v = f"{v:,}"
    return _e(f"{v}{unit}")


def render(doc: dict[str, Any], username: str) -> str:
    body = [f"<h1>tidegate pipelines</h1><p class=muted>as of {_e(doc['generated_at'])}; checkpoint "
            f"store {_e(doc['store'])}; logged in as {_e(username)}</p>"]
    for line in doc.get("spec_errors") or []:
        body.append(f"<p class='badge halted'>invalid spec: {_e(line)}</p>")
    if not doc["pipelines"]:
        body.append("<p>No pipelines yet: add a spec to the pipelines folder.</p>")
    body += [_pipeline(p) for p in doc["pipelines"]]
    return (f"<!doctype html><html><head><meta charset=utf-8><title>tidegate</title><style>{CSS}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def _pipeline(p: dict[str, Any]) -> str:
    state = ("<span class='badge halted'>HALTED</span>" if p["halted"]
             else "<span class='badge ok'>running</span>")
    head = _pos(p["head"]) if p["head"] is not None else f"<span class=muted>{_e(p['head_error'])}</span>"
    name, dag_id = _e(p["pipeline"]), _e(p["dag_id"])
    out = [f"<section class=pipeline id='pipeline-{name}' data-halted='{str(p['halted']).lower()}'>"
           f"<h2>{name} {state}</h2>"
           f"<p class=muted>tenant {_e(p.get('tenant') or '-')}; DAG <a target=_top "
           f"href='../dags/{dag_id}'>{dag_id}</a>; source "
           f"{_e(p['source_kind'])}; schedule {_e(p['schedule'] or 'manual')}; source head {head}</p>"]
    out.append(_incidents(p))
    out.append(_sinks(p))
    out.append(_runs(p))
    out.append("</section>")
    return "".join(out)


def _incidents(p: dict[str, Any]) -> str:
    open_ = [i for i in p["incidents"] if not i["resolved"]]
    done = [i for i in p["incidents"] if i["resolved"]][-3:]
    if not open_ and not done:
        return ""
    rows = []
    for i in open_ + done:
        if i["resolved"]:
            how = f"resolved: {_e(i['resolution'])} by {_e(i['resolved_by'])} ({_e(i['reason'])})"
        else:
            how = "".join(
                f"<pre>{_e(json.dumps(params))}</pre>" for params in i["resolve_with"]
            ) + (f"<span class=muted>trigger {_e(p['dag_id'])} with one of these params, e.g. "
                 f"<code>airflow dags trigger {_e(p['dag_id'])} --conf "
                 f"'{_e(json.dumps(i['resolve_with'][0]))}'</code></span>")
        rows.append(f"<tr class='incident {'resolved' if i['resolved'] else 'open'}'><td>#{_e(i['id'])}</td>"
                    f"<td>{_e(i['kind'])}</td><td>{_pos(i['from'])}</td><td>{_pos(i['to'])}</td>"
                    f"<td>{_e(i['detected_at'])}<div class=muted>{_e(i['detail'])}</div></td>"
                    f"<td>{how}</td></tr>")
    return ("<h3>Incidents</h3><table class=incidents><tr><th>id</th><th>kind</th><th>missing from</th>"
            "<th>to</th><th>detected</th><th>resolve with</th></tr>" + "".join(rows) + "</table>")


def _sinks(p: dict[str, Any]) -> str:
    rows = [f"<tr class=sink data-sink='{_e(s['id'])}'><td>{_e(s['id'])}</td><td>{_e(s['kind'])}</td>"
            f"<td>{'yes' if s['required'] else 'no'}</td><td>{_pos(s['position'])}</td>"
            f"<td>{_e(s['version'])}</td><td>{_e(s['updated_at'])}</td>"
            f"<td>{_num(s['checkpoint_age_seconds'], ' s')}</td><td>{_num(s['lag_seconds'], ' s')}</td>"
            f"<td>{_num(s['lag_bytes'], ' B')}</td></tr>" for s in p["sinks"]]
    return ("<h3>Sinks</h3><table class=sinks><tr><th>sink</th><th>kind</th><th>required</th>"
            "<th>checkpoint</th><th>version</th><th>written</th><th>age</th><th>lag</th><th>lag bytes</th>"
            "</tr>" + "".join(rows) + "</table>")


def _runs(p: dict[str, Any]) -> str:
    if not p["runs"]:
        return "<h3>Last runs</h3><p class=muted>no delivering run yet</p>"
    sink_ids = [s["id"] for s in p["sinks"]]
    head = "".join(f"<th>{_e(sid)}</th>" for sid in sink_ids)
    rows = []
    for r in p["runs"]:
        cells = []
        for sid in sink_ids:
            js = r["sinks"].get(sid)
            cells.append("<td class=muted>-</td>" if js is None else
                         f"<td>{_num(js['events'])} events, {_num(js['bytes'], ' B')} "
                         f"({_e(js['status'])})</td>")
        rows.append(f"<tr><td>{_e(r['run_id'])}</td><td>{_e(r['mode'])}</td><td>{_e(r['status'])}</td>"
                    f"<td>{_e(r['started_at'])}</td>{''.join(cells)}</tr>")
    return ("<h3>Last runs</h3><table class=runs><tr><th>run</th><th>mode</th><th>status</th><th>started</th>"
            f"{head}</tr>" + "".join(rows) + "</table>")
