"""settled.services: the command line, the dev stack (local Kafka + PostgreSQL) and, later, the HTTP API."""
