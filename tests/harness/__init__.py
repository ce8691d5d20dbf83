"""The tests' one harness: record factories (`tests.harness.factories`) and barrier records
(`tests.harness.barriers`), shared by the unit, integration, engine and chaos suites."""
