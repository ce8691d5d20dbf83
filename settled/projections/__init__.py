"""settled.projections: Postgres projections of ``settled.log``, exactly once, rebuilt from the log (docs/design.md §6).

* `Projector` / `ProjectorConfig` (`_projector`): a read_committed, assign-only consumer per log partition (one
  writer per partition through an advisory lock) that writes a chunk's rows and the partition's next offset in one
  transaction, under the offset row's lock and an expected-offset check (DUR-015).
* `project_batch`, `ProjectionState`, `RowSet`, `fold_reference` (`_rows`): the rows as a pure function of the log,
  derived from the protocol's fold, so live, rebuilt and reference rows agree by construction.
* `TABLES` (`_tables`): the tables, their keys and per-column merge rules; the SQL migrations under
  ``settled/projections/sql/`` mirror them (`migrate`, `check_layout`, `ProjectionNames` in `_schema`).
* `rebuild` and `check` (`_rebuild`): replay from offset 0 into a new schema version and switch atomically; compare
  live, a fresh rebuild and the reference fold at identical offsets; one at a time per projection (an advisory lock,
  `maintenance_lock_key`; a second raises `RebuildInProgressError`). The replay (`_bulk`) folds whole partitions in
  memory and writes their final rows once with COPY, one process per share of the partitions (`ReplayTimings` says
  where its time went), then catches up through projectors seeded with the folded states.
* A record whose rows PostgreSQL refuses (a data error, told from a lost connection by SQLSTATE: `classify`,
  `ErrorKind`) is entered in the ``projection_quarantine`` table (`QUARANTINE`, `QuarantinedRecord`,
  `read_quarantine`) in the transaction that moves the offset past it; the projector goes on, a rebuild does the
  same, and `check` leaves those records out and lists them.
* `ProjectionReader` (`_queries`): queries that accept ``after=<receipt>`` (read-your-writes).

Never imports `settled.processors`: the worker and the projections are independent (import-linter contract).
"""

from settled.projections._bulk import RebuildWorkerError, ReplayTimings
from settled.projections._metrics import ProjectionMetrics
from settled.projections._projector import ChunkApplied, Projector, ProjectorConfig
from settled.projections._queries import ProjectionReader, ReadYourWritesTimeoutError
from settled.projections._rebuild import (
    CheckReport,
    Difference,
    RebuildInProgressError,
    RebuildProgress,
    RebuildResult,
    check,
    log_end_offsets,
    maintenance_lock_key,
    rebuild,
)
from settled.projections._rows import (
    FOLD_COLUMNS,
    DuplicateRowError,
    ProjectionState,
    RowSet,
    fold_reference,
    is_partition_conversation,
    project_batch,
    row_group,
)
from settled.projections._schema import (
    LAYOUT_VERSION,
    PROJECTION_NAME,
    Migration,
    ProjectionLayoutError,
    ProjectionNames,
    check_layout,
    default_schema,
    migrate,
    migrations,
    read_meta,
    schema_exists,
)
from settled.projections._sqlstate import ErrorKind, classify
from settled.projections._store import (
    OffsetConflictError,
    ProjectionWriter,
    QuarantinedRecord,
    read_offsets,
    read_quarantine,
    read_table,
)
from settled.projections._tables import QUARANTINE, TABLES, MergeRule, TableMode, TableSpec, merge_rows

__all__ = [
    "FOLD_COLUMNS",
    "LAYOUT_VERSION",
    "PROJECTION_NAME",
    "QUARANTINE",
    "TABLES",
    "CheckReport",
    "ChunkApplied",
    "Difference",
    "DuplicateRowError",
    "ErrorKind",
    "MergeRule",
    "Migration",
    "OffsetConflictError",
    "ProjectionLayoutError",
    "ProjectionMetrics",
    "ProjectionNames",
    "ProjectionReader",
    "ProjectionState",
    "ProjectionWriter",
    "Projector",
    "ProjectorConfig",
    "QuarantinedRecord",
    "ReadYourWritesTimeoutError",
    "RebuildInProgressError",
    "RebuildProgress",
    "RebuildResult",
    "RebuildWorkerError",
    "ReplayTimings",
    "RowSet",
    "TableMode",
    "TableSpec",
    "check",
    "check_layout",
    "classify",
    "default_schema",
    "fold_reference",
    "is_partition_conversation",
    "log_end_offsets",
    "maintenance_lock_key",
    "merge_rows",
    "migrate",
    "migrations",
    "project_batch",
    "read_meta",
    "read_offsets",
    "read_quarantine",
    "read_table",
    "rebuild",
    "row_group",
    "schema_exists",
]
