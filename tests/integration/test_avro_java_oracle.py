"""The Java Avro library as the oracle of settled's schemas and single-object encoding (issue 4, acceptance).

``SchemaNormalization.parsingFingerprint64`` must equal settled's fingerprint of every shipped schema (parsed from the
shipped files in dependency order, and from each standalone schema alone); records that Java's
``BinaryMessageEncoder`` writes (from their Avro JSON encoding) decode in settled to the same record, byte for byte
equal to settled's encoding; and records settled writes decode in Java's ``BinaryMessageDecoder`` to the same datum.

The Java library is resolved from Maven Central by Maven (tests/java/pom.xml) into the jar cache
(``SETTLED_JAR_CACHE_DIR``, default ``~/.cache/settled/jars``) as ``avro-<version>`` once; the oracle program is
compiled with ``javac`` per run. Skipped, with the reason, only when ``javac``, ``java`` or ``mvn`` is missing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from settled._settings import Settings
from settled.schemas import (
    LOG_EVENT_TYPES,
    TOPIC_RECORD_TYPES,
    AvroRecord,
    Codec,
    DeclaredToolCall,
    InputRef,
    LogBatch,
    SubmissionPayload,
    ToolError,
    Usage,
    current_schemas,
)
from tests.unit.schemas._strategies import records

AVRO_VERSION = "1.12.0"
JAVA_DIR = Path(__file__).resolve().parents[1] / "java"
RECORD_TYPES: list[type[AvroRecord]] = [
    *TOPIC_RECORD_TYPES,
    LogBatch,
    *LOG_EVENT_TYPES,
    InputRef,
    SubmissionPayload,
    ToolError,
    Usage,
    DeclaredToolCall,
]
CODEC = Codec()
_MVN_TIMEOUT_S = 600.0
_JAVA_TIMEOUT_S = 120.0

_missing = [tool for tool in ("javac", "java", "mvn") if shutil.which(tool) is None]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"the Java oracle needs {', '.join(_missing)} on PATH")


def _avro_jars() -> Path:
    """Resolve org.apache.avro:avro and its dependencies once into the settled jar cache."""
    lib = Settings().jar_cache_dir / f"avro-{AVRO_VERSION}"
    if (lib / ".complete").exists():
        return lib
    partial = lib.with_name(lib.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(JAVA_DIR / "pom.xml"), "package",
         f"-Davro.version={AVRO_VERSION}", f"-Dlib.dir={partial}"],
        check=True, timeout=_MVN_TIMEOUT_S,
    )  # fmt: skip
    (partial / ".complete").touch()
    try:
        partial.rename(lib)
    except OSError:  # another run finished first: use its copy
        shutil.rmtree(partial, ignore_errors=True)
    return lib


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command that runs the compiled oracle, minus its arguments."""
    jars = _avro_jars()
    classes = tmp_path_factory.mktemp("oracle-classes")
    classpath = f"{jars}/*"
    subprocess.run(
        ["javac", "-Xlint:all", "-Werror", "-cp", classpath, "-d", str(classes), str(JAVA_DIR / "AvroOracle.java")],
        check=True, timeout=_JAVA_TIMEOUT_S,
    )  # fmt: skip
    return [
        "java",
        "-cp",
        f"{classpath}{os.pathsep}{classes}",
        "AvroOracle",
        str(resources.files("settled.schemas") / "avsc"),
    ]


def _prepare(work: Path) -> None:
    (work / "order.txt").write_text("\n".join(current_schemas().file_order) + "\n")
    standalone = work / "standalone"
    standalone.mkdir()
    for named in current_schemas().schemas.values():
        (standalone / f"{named.full_name}.avsc").write_text(named.standalone_json)


def _run(oracle: list[str], work: Path) -> None:
    done = subprocess.run([*oracle, str(work)], capture_output=True, text=True, timeout=_JAVA_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-4000:]


def _tsv(path: Path) -> dict[str, int]:
    return {name: int(value) for name, value in (line.split("\t") for line in path.read_text().splitlines())}


def _avro_json(record: AvroRecord) -> str:
    out = io.StringIO()
    fastavro.json_writer(out, CODEC.schema(record.AVRO_NAME).parsed, [record.to_avro()])
    return out.getvalue().strip()


def test_java_fingerprints_equal_settleds(oracle: list[str], tmp_path: Path) -> None:
    _prepare(tmp_path)
    _run(oracle, tmp_path)
    ours = {name: named.fingerprint for name, named in current_schemas().schemas.items()}
    assert _tsv(tmp_path / "fingerprints.tsv") == ours
    assert _tsv(tmp_path / "standalone.tsv") == ours


@settings(deadline=None, max_examples=4, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_records_cross_between_java_and_settled(
    oracle: list[str], tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    work = tmp_path_factory.mktemp("cases")
    _prepare(work)
    cases = {f"case{index:02d}": data.draw(records(cls)) for index, cls in enumerate(RECORD_TYPES)}
    for base, record in cases.items():
        (work / f"{base}.name").write_text(record.AVRO_NAME)
        (work / f"{base}.json").write_text(_avro_json(record))
        (work / f"{base}.py.bin").write_bytes(CODEC.encode(record))
    _run(oracle, work)
    for base, record in cases.items():
        from_java = (work / f"{base}.java.bin").read_bytes()
        assert from_java == CODEC.encode(record), type(record).__name__  # Java writes settled's bytes exactly
        assert CODEC.decode(from_java, topic="java", offset=0) == record  # and settled reads them back
        java_read = json.loads((work / f"{base}.java.json").read_text())
        assert java_read == json.loads(_avro_json(record)), type(record).__name__  # Java read what settled wrote
