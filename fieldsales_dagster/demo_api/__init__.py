"""A deterministic, synthetic demo instance of the Field-Sales read API (stdlib only).

    from fieldsales_dagster.demo_api import DemoServer, DemoConfig

    with DemoServer(DemoConfig(transactions=2000, seed=0)) as server:
        server.base_url, server.token, server.behaviour, server.dataset, server.requests

It follows the API document on its own and imports nothing else of ``fieldsales_dagster``, so a
mismatch between the client and the document shows up in tests.
"""

from fieldsales_dagster.demo_api.data import Dataset
from fieldsales_dagster.demo_api.server import Behaviour, DemoConfig, DemoServer, RequestRecord

__all__ = ["Behaviour", "Dataset", "DemoConfig", "DemoServer", "RequestRecord"]
