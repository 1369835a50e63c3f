"""Grafana as code: provisioning files and dashboards for logcapture (docs/grafana.md).

``install(DIR, Connection(...))`` writes the data source, the dashboards provider and the
dashboards; ``all_dashboards()`` returns the dashboard JSON models; ``interpolate`` does
Grafana's variable and macro expansion so tests run each panel's real SQL.
"""

from .dashboards import all_dashboards
from .macros import interpolate
from .provisioning import (
    Connection,
    connection_from_url,
    install,
    make_connection,
    password_reference,
)

__all__ = ["Connection", "all_dashboards", "connection_from_url", "install", "interpolate",
           "make_connection", "password_reference"]
