"""confluent-kafka's Schema Registry client behind settled's `SchemaRegistry` protocol (docs/design.md §7, §10).

A public module that ``settled.schemas`` does not import: the pure core imports ``settled.schemas`` and must never
reach confluent-kafka (docs/design.md §1b, the import-linter contract). Import it where a registry is configured:
``from settled.schemas.registry import ConfluentSchemaRegistry``. ``mock://`` URLs give confluent-kafka's in-memory
``MockSchemaRegistryClient`` (no registry server can run here; docs/design.md §7).
"""

from __future__ import annotations

from typing import Any

from settled.schemas._codec import SchemaRegistryUnavailableError

__all__ = ["ConfluentSchemaRegistry"]

_NOT_FOUND = 404


class ConfluentSchemaRegistry:
    """A `settled.schemas.SchemaRegistry` over confluent-kafka's ``SchemaRegistryClient``.

    Attributes:
        client: The confluent-kafka client (shared with confluent-kafka serializers if wanted).
    """

    def __init__(self, client: Any) -> None:
        """Wrap a client.

        Args:
            client: A ``confluent_kafka.schema_registry.SchemaRegistryClient`` (or its mock).
        """
        self.client = client

    @classmethod
    def from_url(cls, url: str, **conf: Any) -> ConfluentSchemaRegistry:
        """Build a client for a registry URL.

        Args:
            url: The registry URL; ``mock://<name>`` gives the in-memory mock.
            **conf: Further ``SchemaRegistryClient`` settings (e.g. ``basic.auth.user.info``).

        Returns:
            The adapter.
        """
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return cls(SchemaRegistryClient.new_client({"url": url, **conf}))

    def register(self, subject: str, schema_json: str) -> int:
        """Register (or find) an Avro schema under a subject.

        Args:
            subject: The subject (settled uses the record's full name).
            schema_json: The schema text.

        Returns:
            The schema id.

        Raises:
            SchemaRegistryUnavailableError: If the registry refuses or does not answer.
        """
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return int(self.client.register_schema(subject, Schema(schema_json, "AVRO")))
        except (SchemaRegistryError, OSError) as exc:
            raise SchemaRegistryUnavailableError(f"cannot register {subject}: {exc}") from exc

    def schema_json(self, schema_id: int) -> str | None:
        """Return the schema text of an id.

        Args:
            schema_id: The id.

        Returns:
            The text, or None if the registry answers that it has no such id.

        Raises:
            SchemaRegistryUnavailableError: If the registry fails otherwise.
        """
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                return None
            raise SchemaRegistryUnavailableError(f"cannot look up schema id {schema_id}: {exc}") from exc
        except OSError as exc:
            raise SchemaRegistryUnavailableError(f"cannot look up schema id {schema_id}: {exc}") from exc
        return None if schema is None else str(schema.schema_str)
