"""`relay web`: the runs, one run with its specialists and live trace, what waits on a
person (Approve and Deny, Answer, Raise the budget), a JSON API under /api/ and
Prometheus metrics on /metrics.

Starlette routes requests and serves the files; Jinja2 renders the pages;
uvicorn serves it (`relay web`). Every request needs basic auth.
"""

from workers.web.app import build_app
from workers.web.auth import WebSettings

__all__ = ["WebSettings", "build_app"]
