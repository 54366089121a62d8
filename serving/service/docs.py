"""``/docs`` without the internet: Swagger UI served from the ``swagger-ui-bundle-v2`` package's files.

FastAPI's default page loads Swagger UI from a CDN, which is blank on an offline host. Here the
JavaScript and CSS come from the installed package (``pip install 'suffice[serve]'`` brings it);
without it, ``/docs`` is a short page that says how to get it and where the schema is
(``/openapi.json``). ReDoc (CDN only) is off.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
NO_ASSETS = """<!doctype html><html><head><meta charset="utf-8"><title>suffice API</title></head><body>
<h1>suffice API</h1><p>The interactive docs need Swagger UI's files, which are not installed:
<code>pip install swagger-ui-bundle-v2</code> (part of <code>pip install 'suffice[serve]'</code>), then restart.</p>
<p>The OpenAPI schema is at <a href="/openapi.json">/openapi.json</a>.</p></body></html>"""


def swagger_assets() -> Path | None:
    """The folder with swagger-ui-bundle.js and swagger-ui.css, or None when the package is missing."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    path = Path(str(swagger_ui_bundle.swagger_ui_path))
    return path if (path / "swagger-ui-bundle.js").is_file() and (path / "swagger-ui.css").is_file() else None


def add_docs(app: FastAPI, title: str) -> None:
    """``GET /docs`` (Swagger UI from local files, or the page saying how to get them) on an app made with docs_url=None."""
    assets = swagger_assets()
    if assets is not None:
        app.mount(ASSETS, StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        if assets is None:
            return HTMLResponse(NO_ASSETS)
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{title} - API docs",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
