"""Reads a Marshal telemetry directory with pyarrow and checks the documented schema.

Usage: python interop_check.py DIR EXPECTED_GPU_ROWS
Exits non-zero with a message on any mismatch.
"""
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

root, expected = sys.argv[1], int(sys.argv[2])
# `node` is both a column and a partition key: read the partition as the same
# dictionary type the files use.
gpu = ds.dataset(
    f"{root}/kind=gpu",
    format="parquet",
    partitioning=ds.HivePartitioning.discover(infer_dictionary=True),
)
table = gpu.to_table()
assert table.num_rows == expected, f"{table.num_rows} rows, expected {expected}"
schema = table.schema
want = {
    "timestamp": pa.timestamp("us", tz="UTC"),
    "gpu_index": pa.uint16(),
    "sm_util_pct": pa.float32(),
    "mem_used_bytes": pa.uint64(),
    "nvlink_tx_kib": pa.uint64(),
    "nvlink_tx_per_link_kib": None,  # list<uint64>, checked below
    "pcie_tx_kib_per_s": pa.uint32(),
    "power_mw": pa.uint32(),
    "temperature_c": pa.float32(),
    "throttle_reasons": pa.uint64(),
    "xid": pa.uint32(),
    "mig_mode": pa.bool_(),
}
for name, typ in want.items():
    assert name in schema.names, f"missing column {name}"
    if typ is not None:
        assert schema.field(name).type == typ, f"{name}: {schema.field(name).type} != {typ}"
assert pa.types.is_list(schema.field("nvlink_tx_per_link_kib").type)
for gone in ["nvlink_tx_bytes", "pcie_tx_bytes_per_s", "power_w"]:
    assert gone not in schema.names, f"schema 1 column {gone} still present"
for name in ["node", "gpu_type", "health", "job_id", "mem_phase"]:
    t = schema.field(name).type
    assert pa.types.is_dictionary(t) and pa.types.is_string(t.value_type), f"{name}: {t}"
# Hive partitions (date, node) come back as columns too.
assert "date" in schema.names, schema.names
phases = set(table.column("mem_phase").drop_null().to_pylist())
assert phases <= {"warmup", "steady", "eval", "checkpoint"}, phases
# Every file carries the schema version in its key-value metadata.
for f in gpu.files:
    md = pq.read_metadata(f).metadata
    assert md.get(b"marshal.telemetry.schema_version") == b"2", (f, md)
print(f"pyarrow {pa.__version__}: {table.num_rows} rows, {len(schema.names)} columns, phases {sorted(phases)}")
