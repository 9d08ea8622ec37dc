"""The web dashboard of a tuning log and a tune-cluster (``tuner dashboard``, ``tuner daemon --http-listen``).

* ``readmodel``: :class:`DashboardReader`, what every page and API answer shows, as JSON values.
* ``live``: the :class:`LiveFleet` protocol, the daemon's state as typed :mod:`tuner.fleet` values.
* ``app``: :func:`create_app`, the Starlette app (pages, JSON API, static assets, access rules).
* ``server``: :class:`DashboardServer`, uvicorn in a thread, stopped gracefully.

Starlette, Jinja2 and uvicorn are the ``dashboard`` extra; nothing else of the tuner imports them.
"""

DASHBOARD_INSTALL_HINT = "pip install 'tunefleet[dashboard]'"
