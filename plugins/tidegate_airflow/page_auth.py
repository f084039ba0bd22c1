"""Who is calling the tidegate page, what they may do, and the page's CSRF protection.

Authentication is Airflow's own: the JWT of the ``_token`` cookie the UI sets at login, or a
bearer token (``POST /auth/token``). Authorization asks the configured auth manager about the
pipeline's DAG only through the generic API (``is_authorized_dag`` with ``DagDetails(id=...)``),
as Airflow's REST API does, so SimpleAuthManager, FAB or Keycloak deployments decide as they
do for Airflow's own pages:

* see a pipeline (page and ``/api/status``): ``GET`` on its DAG;
* resolve an incident (a DAG run is triggered): ``POST`` on its DAG's runs
  (``DagAccessEntity.RUN``), what ``POST /api/v2/dags/{dag_id}/dagRuns`` requires;
* pause and resume: ``PUT`` on its DAG, what ``PATCH /api/v2/dags/{dag_id}`` requires.

CSRF: a browser sends the cookie with any request to the api-server, so every action is a POST
that must carry, when it is authenticated by the cookie, (1) an ``Origin`` (or, without one, a
``Referer``) of the api-server itself and (2) the form's ``csrf_token``: an HMAC of the session's
JWT under ``[api] secret_key``, which another site can neither read nor compute. A request with
a bearer token is not CSRF-able (a browser never adds that header by itself) and skips both.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else None


async def current_user(request: Request) -> Any:
    """The logged-in user (HTTP 401 without a valid token)."""
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    return await resolve_user_from_token(bearer(request) or request.cookies.get(COOKIE))


def user_name(user: Any) -> str:
    return str(user.get_name()) if hasattr(user, "get_name") else str(getattr(user, "username", "?"))


def may(user: Any, dag_id: str, method: str, *, runs: bool = False) -> bool:
    """Whether the auth manager lets ``user`` do ``method`` on DAG ``dag_id`` (on its runs)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return get_auth_manager().is_authorized_dag(
        method=method, access_entity=DagAccessEntity.RUN if runs else None,
        details=DagDetails(id=dag_id), user=user)


def require(user: Any, dag_id: str, method: str, what: str, *, runs: bool = False) -> None:
    if not may(user, dag_id, method, runs=runs):
        raise HTTPException(403, f"user {user_name(user)!r} may not {what} (DAG {dag_id}): "
                                 f"ask an Airflow admin for that right on the DAG")


# --------------------------------------------------------------------------- CSRF


def csrf_token(request: Request) -> str:
    """The form token of this session (empty for a bearer-token client, which needs none)."""
    session = request.cookies.get(COOKIE)
    if not session or bearer(request):
        return ""
    return hmac.new(_secret(), b"tidegate-page:" + session.encode(), hashlib.sha256).hexdigest()


def check_csrf(request: Request, form_token: str | None) -> None:
    """Refuse (403) a cookie-authenticated action from another origin or without this
    session's form token."""
    if bearer(request):
        return
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or not _same_origin(request, origin):
        raise HTTPException(403, "refused: the action did not come from the tidegate page of this "
                                 "server (Origin/Referer missing or foreign); use the page's buttons")
    if not form_token or not hmac.compare_digest(form_token, csrf_token(request)):
        raise HTTPException(403, "refused: the form's csrf_token is missing or out of date (the "
                                 "session changed since the page was loaded); reload the page and retry")


def _same_origin(request: Request, origin: str) -> bool:
    from airflow.configuration import conf

    seen = urlsplit(origin)
    base_url = conf.get("api", "base_url", fallback="") or ""
    allowed = {request.headers.get("host", ""), urlsplit(base_url).netloc}
    return seen.scheme in ("http", "https") and seen.netloc in allowed - {""}


def _secret() -> bytes:
    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or conf.get("api_auth", "jwt_secret", fallback="")
    if not secret:
        raise HTTPException(500, "the tidegate page needs [api] secret_key to protect its forms")
    return secret.encode()
