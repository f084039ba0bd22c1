"""The tidegate page of the Airflow UI: a FastAPI app mounted under the api-server at
``/tidegate`` (registered by ``plugins/tidegate_plugin.py``, which owns the prefix and builds this
app on the first request, with a "tidegate" nav entry).

It uses Airflow's own auth (``page_auth``): the session cookie the UI sets at login (or a bearer
token); without one a browser is sent to Airflow's login page and an API client gets 401. Each
pipeline is listed (page and ``/api/status``) only to users who may read its DAG; the actions
(resolve an incident, pause, resume: ``page_actions``) are POST forms, authorized per DAG and
CSRF-protected. The data comes from the engine (:func:`tidegate.status.pipelines_status`); this
module renders it.
"""

from __future__ import annotations

import html
import json
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from . import page_actions, page_auth
from .charts import history_charts


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


def visible_document(user: Any) -> dict[str, Any]:
    """The status document of the pipelines whose DAG ``user`` may read (no other source is
    even asked for its head), each with its DAG's ``paused`` state and what the user may do
    (``may``). Spec errors can name any pipeline: shown only to a user who sees every one."""
    from tidegate.parts import Parts
    from tidegate.status import pipelines_status

    hidden: set[str] = set()

    def readable(pipeline: str) -> bool:
        if page_auth.may(user, dag_id_of(pipeline), "GET"):
            return True
        hidden.add(pipeline)
        return False

    doc = pipelines_status(parts=Parts(_connection_lookup), include=readable)
    paused = page_actions.paused_states([p["dag_id"] for p in doc["pipelines"]])
    for p in doc["pipelines"]:
        p["paused"] = paused.get(p["dag_id"])
        p["may"] = {"resolve": page_auth.may(user, p["dag_id"], "POST", runs=True),
                    "pause": page_auth.may(user, p["dag_id"], "PUT")}
    if hidden:
        doc["spec_errors"] = []
    return doc


User = Annotated[Any, Depends(page_auth.current_user)]


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _done(request: Request, pipeline: str, message: str, body: dict[str, Any]) -> Response:
    """A browser goes back to the page (which shows ``message``); an API client gets JSON."""
    if _wants_html(request):
        return RedirectResponse(f"../../?done={quote(message)}#pipeline-{quote(pipeline)}", 303)
    return JSONResponse(body)


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {k: str(v) for k, v in form.items()}


def create_app() -> FastAPI:
    app = FastAPI(title="tidegate", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def to_login(request: Request, exc: HTTPException) -> Response:
        # A browser without a session goes to Airflow's login page and comes back here.
        if exc.status_code == 401 and _wants_html(request) and request.method == "GET":
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), 303)
        if _wants_html(request):
            page = render_error(exc.status_code, str(exc.detail))
            return HTMLResponse(page, status_code=exc.status_code)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse)
    async def page(request: Request, user: User, done: str | None = None) -> HTMLResponse:
        doc = await run_in_threadpool(visible_document, user)
        return HTMLResponse(render(doc, page_auth.user_name(user), page_auth.csrf_token(request), done))

    @app.get("/api/status")
    async def status(user: User) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(visible_document, user))

    @app.post("/pipelines/{pipeline}/resolve")
    async def resolve(request: Request, pipeline: str, user: User) -> Response:
        form = await _form(request)
        page_auth.check_csrf(request, form.get("csrf_token"))
        dag_id, who = dag_id_of(pipeline), page_auth.user_name(user)
        page_auth.require(user, dag_id, "POST", "trigger runs to resolve incidents", runs=True)
        try:
            conf = page_actions.resolution_conf(form, await run_in_threadpool(open_kinds, pipeline), who)
            run_id = await run_in_threadpool(page_actions.trigger_run, dag_id, conf, who)
        except page_actions.FormError as exc:
            raise HTTPException(400, str(exc)) from None
        return _done(request, pipeline, f"{dag_id}: run {run_id} triggered by {who} with "
                                        f"resolve={conf['resolve']}",
                     {"dag_id": dag_id, "run_id": run_id, "conf": conf, "triggering_user_name": who})

    @app.post("/pipelines/{pipeline}/pause")
    async def pause(request: Request, pipeline: str, user: User) -> Response:
        return await _pause(request, pipeline, user, True)

    @app.post("/pipelines/{pipeline}/resume")
    async def resume(request: Request, pipeline: str, user: User) -> Response:
        return await _pause(request, pipeline, user, False)

    return app


async def _pause(request: Request, pipeline: str, user: Any, paused: bool) -> Response:
    form = await _form(request)
    page_auth.check_csrf(request, form.get("csrf_token"))
    dag_id = dag_id_of(pipeline)
    page_auth.require(user, dag_id, "PUT", "pause or resume it")
    try:
        await run_in_threadpool(page_actions.set_paused, dag_id, paused)
    except page_actions.FormError as exc:
        raise HTTPException(404, str(exc)) from None
    word = "paused" if paused else "resumed"
    return _done(request, pipeline, f"{dag_id} {word} by {page_auth.user_name(user)}",
                 {"dag_id": dag_id, "is_paused": paused})


def dag_id_of(pipeline: str) -> str:
    return f"cdc_{pipeline}"  # the DAG factory's naming (PipelineSpec.dag_id)


def open_kinds(pipeline: str) -> list[str]:
    """Kinds of the pipeline's open incidents, from the checkpoint store."""
    from tidegate.store import open_store

    store = open_store()
    try:
        return [i.kind for i in store.incidents.all(pipeline) if not i.resolved]
    finally:
        store.close()


# --------------------------------------------------------------------------- rendering

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1d2733}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin:0} h3{font-size:.95rem;margin:.9rem 0 .3rem}
section.pipeline{border:1px solid #cfd8e3;border-radius:6px;padding:.8rem 1rem;margin:0 0 1rem}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:4px;font-size:.8rem;font-weight:600}
.ok{background:#dcf2e3;color:#155d2c} .halted{background:#fbdada;color:#8a1111}
.paused{background:#ece6d2;color:#6a5410} .note{background:#e3eefb;padding:.4rem .6rem;border-radius:4px}
table{border-collapse:collapse;font-size:.85rem;width:100%} th,td{border-bottom:1px solid #e4e9ef;
padding:.25rem .4rem;text-align:left;vertical-align:top} code,pre{font-size:.8rem;background:#f3f5f8}
pre{padding:.3rem .5rem;margin:.2rem 0;white-space:pre-wrap} .muted{color:#66727f;font-size:.8rem}
form.inline{display:inline} form.resolve{margin:.5rem 0;padding:.5rem;border:1px dashed #cfd8e3}
form.resolve textarea{width:100%;max-width:40rem}
details summary{cursor:pointer;color:#2a6fb0;font-size:.75rem}
.charts{display:flex;flex-wrap:wrap;gap:.8rem} svg.chart{border:1px solid #e4e9ef;border-radius:4px}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _pos(p: Any, text: str | None = None) -> str:
    """A position as people read it, its raw JSON a click away."""
    if p is None:
        return "<span class=muted>none</span>"
    raw = _e(json.dumps(p, sort_keys=True))
    return (f"<code class=pos>{_e(text) if text else raw}</code>"
            f"<details><summary>JSON</summary><pre>{raw}</pre></details>")


def _num(v: Any, unit: str = "") -> str:
    if v is None:
        return "<span class=muted>?</span>"
    if isinstance(v, float):
        v = f"{v:,.1f}"
    elif isinstance(v, int):
        v = f"{v:,}"
    return _e(f"{v}{unit}")


def _csrf(token: str) -> str:
    return f"<input type=hidden name=csrf_token value='{_e(token)}'>"


def render_error(status: int, detail: str) -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>tidegate: {status}</title>"
            f"<style>{CSS}</style></head><body><h1>tidegate: not done</h1><p class='badge halted'>"
            f"HTTP {status}</p><p class=error>{_e(detail)}</p><p><a href='javascript:history.back()'>back</a>"
            f" | <a href='/tidegate/'>the tidegate page</a></p></body></html>")


def render(doc: dict[str, Any], username: str, csrf: str = "", done: str | None = None) -> str:
    body = [f"<h1>tidegate pipelines</h1><p class=muted>as of {_e(doc['generated_at'])}; checkpoint "
            f"store {_e(doc['store'])}; logged in as {_e(username)}</p>"]
    if done:
        body.append(f"<p class=note id=done>{_e(done)}</p>")
    for line in doc.get("spec_errors") or []:
        body.append(f"<p class='badge halted'>invalid spec: {_e(line)}</p>")
    if not doc["pipelines"]:
        body.append("<p>No pipelines to show: none yet (add a spec to the pipelines folder), or none "
                    "whose DAG you may read.</p>")
    body += [_pipeline(p, csrf) for p in doc["pipelines"]]
    return (f"<!doctype html><html><head><meta charset=utf-8><title>tidegate</title><style>{CSS}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def _pipeline(p: dict[str, Any], csrf: str) -> str:
    state = ("<span class='badge halted'>HALTED</span>" if p["halted"]
             else "<span class='badge ok'>running</span>")
    if p.get("paused"):
        state += " <span class='badge paused'>PAUSED</span>"
    head = (_pos(p["head"], p.get("head_text")) if p["head"] is not None
            else f"<span class=muted>{_e(p['head_error'])}</span>")
    name, dag_id = _e(p["pipeline"]), _e(p["dag_id"])
    paused = "true" if p.get("paused") else "false" if p.get("paused") is not None else "unknown"
    out = [f"<section class=pipeline id='pipeline-{name}' data-halted='{str(p['halted']).lower()}' "
           f"data-paused='{paused}'><h2>{name} {state} {_pause_form(p, csrf)}</h2>"
           f"<p class=muted>tenant {_e(p.get('tenant') or '-')}; DAG <a target=_top "
           f"href='../dags/{dag_id}'>{dag_id}</a>; source "
           f"{_e(p['source_kind'])}; schedule {_e(p['schedule'] or 'manual')}</p>"
           f"<div class=muted>source head {head}</div>"]
    out.append(_incidents(p, csrf))
    out.append(_sinks(p))
    out.append("<h3>Lag and events per run</h3>" + history_charts(p.get("history") or []))
    out.append(_runs(p))
    out.append("</section>")
    return "".join(out)


def _pause_form(p: dict[str, Any], csrf: str) -> str:
    if not (p.get("may") or {}).get("pause") or p.get("paused") is None:
        return ""
    action, label = ("resume", "Resume") if p["paused"] else ("pause", "Pause")
    return (f"<form class=inline method=post action='pipelines/{_e(p['pipeline'])}/{action}'>{_csrf(csrf)}"
            f"<button type=submit class='{action}'>{label}</button></form>")


def _resolve_form(p: dict[str, Any], open_: list[dict[str, Any]], csrf: str) -> str:
    if not open_:
        return ""
    if not (p.get("may") or {}).get("resolve"):
        return "<p class=muted>you may not trigger runs of this DAG: ask someone who may to resolve it</p>"
    ways = page_actions.resolutions_for(i["kind"] for i in open_)
    if not ways:
        return ("<p class=muted>the open incidents need different resolutions: resolve them from the "
                "DAG's trigger form, or with <code>tidegate run --resolve</code></p>")
    waits = ("<p class=muted>the DAG is paused: the run waits until it is resumed</p>"
             if p.get("paused") else "")
    options = "".join(f"<option value='{w}'>{w}</option>" for w in ways)
    tables = ("<label>tables (resnapshot only; schema.table, space-separated; empty: all) "
              "<input name=tables size=40></label><br>" if "resnapshot" in ways else "")
    return (f"<form class=resolve method=post action='pipelines/{_e(p['pipeline'])}/resolve'>{_csrf(csrf)}"
            f"<label>resolve <select name=resolve>{options}</select></label><br>{tables}"
            "<label>reason (required, kept with the incident)<br><textarea name=reason rows=2 required "
            "placeholder='why this resolution is right'></textarea></label><br>"
            f"<button type=submit>Resolve: trigger a run as me</button>{waits}</form>")


def _incidents(p: dict[str, Any], csrf: str) -> str:
    open_ = [i for i in p["incidents"] if not i["resolved"]]
    done = [i for i in p["incidents"] if i["resolved"]][-3:]
    if not open_ and not done:
        return ""
    rows = []
    for i in open_ + done:
        if i["resolved"]:
            how = (f"resolved: {_e(i['resolution'])} by <b class=who>{_e(i['resolved_by'])}</b> at "
                   f"{_e(i.get('resolved_at'))} (<span class=why>{_e(i['reason'])}</span>)")
        else:
            how = "".join(
                f"<pre>{_e(json.dumps(params))}</pre>" for params in i["resolve_with"]
            ) + (f"<span class=muted>use the form below, or trigger {_e(p['dag_id'])} with one of these "
                 f"params</span>")
        rows.append(f"<tr class='incident {'resolved' if i['resolved'] else 'open'}'><td>#{_e(i['id'])}</td>"
                    f"<td>{_e(i['kind'])}</td><td>{_pos(i['from'], i.get('from_text'))}</td>"
                    f"<td>{_pos(i['to'], i.get('to_text'))}</td>"
                    f"<td>{_e(i['detected_at'])}<div class=muted>{_e(i['detail'])}</div></td>"
                    f"<td>{how}</td></tr>")
    return ("<h3>Incidents</h3><table class=incidents><tr><th>id</th><th>kind</th><th>missing from</th>"
            "<th>to</th><th>detected</th><th>resolve with</th></tr>" + "".join(rows) + "</table>"
            + _resolve_form(p, open_, csrf))


def _sinks(p: dict[str, Any]) -> str:
    rows = [f"<tr class=sink data-sink='{_e(s['id'])}'><td>{_e(s['id'])}</td><td>{_e(s['kind'])}</td>"
            f"<td>{'yes' if s['required'] else 'no'}</td>"
            f"<td>{_pos(s['position'], s.get('position_text'))}</td>"
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
