"""How settled reaches Kafka: one typed connection from which every Kafka client's configuration is built.

`KafkaConnection` holds the broker addresses and the security settings (SASL, TLS) that every client of a deployment
shares. `settled.Settings.kafka` builds it from the ``SETTLED_KAFKA_*`` settings, and the configuration builders of
`settled.producers` (``producer_config``, ``consumer_config``, ``reader_config``, ``admin_config``) start from its
`KafkaConnection.client_config`, so a property set here reaches the producers, the group consumer, the assign-only
readers and the admin clients alike. Secrets are `pydantic.SecretStr`: hidden in ``repr`` and logs, revealed only in
the dict handed to librdkafka.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

__all__ = ["KafkaConnection", "SaslMechanism", "SecurityProtocol"]

#: librdkafka's ``security.protocol`` values.
SecurityProtocol = Literal["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"]
#: librdkafka's ``sasl.mechanism`` values settled supports (``GSSAPI`` needs a Kerberos build of librdkafka).
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"]

#: Field name → librdkafka property, for every optional connection property (set ones only are passed on).
_PROPERTIES: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
    "ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
}


class KafkaConnection(BaseModel):
    """The broker addresses and security settings shared by every Kafka client of one process.

    Attributes:
        bootstrap_servers: librdkafka ``bootstrap.servers`` (``host:port[,host:port...]``).
        security_protocol: ``security.protocol``; None keeps librdkafka's default (``plaintext``).
        sasl_mechanism: ``sasl.mechanism``; None keeps librdkafka's default (``GSSAPI``).
        sasl_username: ``sasl.username`` (PLAIN and SCRAM).
        sasl_password: ``sasl.password`` (PLAIN and SCRAM), a secret.
        ssl_ca_location: ``ssl.ca.location``: the CA certificate file (PEM) the broker's certificate is checked
            against.
        ssl_certificate_location: ``ssl.certificate.location``: the client's certificate (PEM), for mutual TLS.
        ssl_key_location: ``ssl.key.location``: the client's private key (PEM), for mutual TLS.
        ssl_key_password: ``ssl.key.password``: the private key's passphrase, a secret.
        ssl_endpoint_identification_algorithm: ``ssl.endpoint.identification.algorithm``: ``https`` checks the
            broker's host name against its certificate (librdkafka's default), ``none`` does not.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_endpoint_identification_algorithm: Literal["https", "none"] | None = None

    @model_validator(mode="after")
    def _sasl_credentials_paired(self) -> KafkaConnection:
        if self.sasl_username is not None and self.sasl_password is None:
            raise ValueError("sasl_username is set but sasl_password is not: SASL PLAIN and SCRAM need both")
        if self.sasl_password is not None and self.sasl_username is None:
            raise ValueError("sasl_password is set but sasl_username is not: SASL PLAIN and SCRAM need both")
        return self

    def client_config(self, **properties: Any) -> dict[str, Any]:
        """Return a librdkafka configuration: the connection's properties, then ``properties``.

        Args:
            **properties: The client role's librdkafka properties (``group.id``, ``transactional.id``, ...),
                applied last. Use ``client_config(**{"linger.ms": 1})`` for dotted names.

        Returns:
            The configuration dict, secrets revealed (it goes to librdkafka only: never log it).
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        for field, prop in _PROPERTIES.items():
            value = getattr(self, field)
            if value is None:
                continue
            conf[prop] = value.get_secret_value() if isinstance(value, SecretStr) else value
        conf.update(properties)
        return conf
