"""A panel query of the ClickHouse data source plugin (grafana-clickhouse-datasource), as a
grafana-foundation-sdk dataquery: the SDK ships builders for Grafana's own data sources but
not for this plugin, so this is the plugin's query model (src/types/sql.ts upstream:
``editorType``, ``queryType``, ``rawSql``, ``format``) behind the SDK's ``Dataquery`` variant,
usable wherever the SDK takes a target (``panel.with_target(ClickHouseQuery(sql))``)."""

from __future__ import annotations

from typing import Any, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models.dashboard import DataSourceRef

PLUGIN_ID = "grafana-clickhouse-datasource"
DATASOURCE_UID = "logcapture-clickhouse"
DATASOURCE_NAME = "logcapture ClickHouse"

# The plugin's Format enum (src/types upstream): how the result becomes data frames.
FORMAT_TIME_SERIES = 0  # long rows (time, label..., value) pivoted to one series per label set
FORMAT_TABLE = 1
FORMAT_LOGS = 2

_QUERY_TYPES = {FORMAT_TIME_SERIES: "timeseries", FORMAT_TABLE: "table", FORMAT_LOGS: "logs"}


def datasource_ref() -> DataSourceRef:
    """The provisioned data source, by the fixed uid the provisioning file gives it."""
    return DataSourceRef(type_val=PLUGIN_ID, uid=DATASOURCE_UID)


class ClickHouseDataquery(cogvariants.Dataquery):
    """One SQL query of the ClickHouse plugin."""

    def __init__(self, raw_sql: str, ref_id: str = "A", fmt: int = FORMAT_TABLE) -> None:
        self.raw_sql = raw_sql
        self.ref_id = ref_id
        self.format = fmt

    def to_json(self) -> dict[str, object]:
        ref = datasource_ref().to_json()
        return {
            "datasource": ref,
            "editorType": "sql",
            "queryType": _QUERY_TYPES[self.format],
            "format": self.format,
            "rawSql": self.raw_sql,
            "refId": self.ref_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(data["rawSql"], data.get("refId", "A"), data.get("format", FORMAT_TABLE))


class ClickHouseQuery(cogbuilder.Builder[ClickHouseDataquery]):
    """Builder of :class:`ClickHouseDataquery`, in the SDK's builder style."""

    def __init__(self, raw_sql: str) -> None:
        self._internal = ClickHouseDataquery(raw_sql.strip())

    def build(self) -> ClickHouseDataquery:
        return self._internal

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def format(self, fmt: int) -> Self:
        self._internal.format = fmt
        return self
