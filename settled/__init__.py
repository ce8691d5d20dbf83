"""settled: durable AI-agent conversations, event-sourced on Apache Kafka.

The public surface is curated here; everything else lives in private modules of the subpackages
(``settled.protocol``, ``settled.schemas``, ``settled.producers``, ``settled.processors``,
``settled.projections``, ``settled.services``). Importing this package has no side effects.
"""

from settled._errors import EXIT_CODES, BadInputError, ErrorCategory, SettledError, exit_code
from settled._settings import Settings

__all__ = ["EXIT_CODES", "BadInputError", "ErrorCategory", "Settings", "SettledError", "exit_code"]
__version__ = "0.1.0"
