"""The engine test app, with the API's signing key among its ``api_keys`` (issue 20): the workers of the API tests."""

from __future__ import annotations

import dataclasses

from tests.integration.engine.engine_app import RESOLVER_PUBLIC_B64
from tests.integration.engine.engine_app import app as engine_app

#: The id of the API's signing key (the engine app's resolver key pair, reused).
API_KEY_ID = "api-test"

app = dataclasses.replace(engine_app, api_keys={API_KEY_ID: RESOLVER_PUBLIC_B64})
